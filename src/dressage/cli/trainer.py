"""``dressage trainer``: a trainer process fed by a standalone Proxy (refs over HTTP, data from TQ).

Every flag is generated from the :class:`dressage.train.config.TrainerConfig` tree.
"""

from __future__ import annotations

import argparse
import json
import sys


from dressage.flags import check_writable


def _tree():
    from dressage.flags import ConfigTree
    from dressage.train.config import TrainerConfig

    return ConfigTree(TrainerConfig)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trainer", help="drain a running Proxy's trajectories, restore them from its TransferQueue")
    _tree().add_to(p)
    p.set_defaults(func=_run)


def trainer_config(args: argparse.Namespace):
    """The validated :class:`TrainerConfig` of ``dressage trainer``'s flags (and ``--config`` file)."""
    return _tree().build(args)


def _run(args: argparse.Namespace) -> int:
    from dressage.proxy.config import admin_token_of
    from dressage.train.remote import ProxyTrajectorySource, consume

    cfg = trainer_config(args)
    if cfg.json:  # before the drain, which a report that cannot be written would otherwise lose
        check_writable(cfg.json, "json (--json)", make_parents=True)
    token = admin_token_of(cfg.proxy.admin_token_file, "proxy.admin_token_file (--admin-token-file)")
    source = ProxyTrajectorySource(cfg.proxy.url, token=token, timeout_s=max(cfg.timeout_s, 5.0))
    try:
        report = consume(source, dp_size=cfg.dp_size, expect_sessions=cfg.expect_sessions,
                         timeout_s=cfg.timeout_s, on_lost=cfg.on_lost)
    finally:
        source.close()
    width = max(len(k) for k in report)
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    line, status = verdict(report, cfg.proxy.url)
    print(f"dressage trainer: {line}", file=sys.stderr)
    if cfg.json:
        with open(cfg.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return status


def verdict(report: dict, url: str) -> tuple[str, int]:
    """The last line of a read and its exit status: OK only when Samples were read and no TQ key is left."""
    if report["tq_keys_left"] is None:
        return (f"KEYS UNKNOWN: the TransferQueue keys left after {report['samples']} Samples from "
                f"{report['sessions']} trajectories could not be counted: {report['tq_keys_uncounted']}"), 1
    if report["tq_keys_left"]:
        return (f"KEYS LEFT: {report['tq_keys_left']} TransferQueue keys were not released after "
                f"{report['samples']} Samples from {report['sessions']} trajectories"), 1
    if not report["samples"]:
        return (f"EMPTY: {url} had no finalized trajectory to hand over; finalize sessions first, or give "
                "--expect-sessions N to wait (--timeout S) for them"), 1
    return f"OK: {report['samples']} Samples restored and checked from {report['sessions']} trajectories", 0
