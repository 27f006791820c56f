"""``dressage trainer``: a trainer process fed by a standalone Proxy (refs over HTTP, data from TQ)."""

from __future__ import annotations

import argparse
import json
import os
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trainer", help="drain a running Proxy's trajectories, restore them from its TransferQueue",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--proxy-url", required=True, metavar="URL", help="the Proxy, e.g. http://127.0.0.1:8000")
    p.add_argument("--admin-token-file", metavar="PATH", default=None,
                   help="file holding the Proxy's admin token (else $DRESSAGE_ADMIN_TOKEN, else none)")
    p.add_argument("--dp-size", type=int, default=1, metavar="N", help="data-parallel ranks to shard the batch over (default: %(default)s)")
    p.add_argument("--expect-sessions", type=int, default=None, metavar="N",
                   help="read until this many trajectories arrived (default: one read)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds to wait for them (default: %(default)s)")
    p.add_argument("--on-lost", choices=("fail", "drop", "reroll"), default="fail",
                   help="what to do with Samples whose StorageUnit lost their fields (default: %(default)s)")
    p.add_argument("--json", metavar="FILE", default=None, help="write the report as JSON here")
    p.set_defaults(func=_run)


def _token(args: argparse.Namespace) -> str | None:
    if args.admin_token_file:
        with open(args.admin_token_file, encoding="utf-8") as f:
            return f.read().strip() or None
    return os.environ.get("DRESSAGE_ADMIN_TOKEN") or None


def _run(args: argparse.Namespace) -> int:
    from dressage.train.remote import ProxyTrajectorySource, consume

    source = ProxyTrajectorySource(args.proxy_url, token=_token(args), timeout_s=max(args.timeout, 5.0))
    try:
        report = consume(source, dp_size=args.dp_size, expect_sessions=args.expect_sessions,
                         timeout_s=args.timeout, on_lost=args.on_lost)
    finally:
        source.close()
    width = max(len(k) for k in report)
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    verdict = "OK" if report["tq_keys_left"] == 0 else "KEYS LEFT"
    print(f"dressage trainer: {verdict}: {report['samples']} Samples restored and checked "
          f"from {report['sessions']} trajectories", file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0 if report["tq_keys_left"] == 0 else 1
