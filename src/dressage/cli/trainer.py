"""``dressage trainer``: a trainer process fed by a standalone Proxy (refs over HTTP, data from TQ).

Every flag is generated from the :class:`dressage.train.config.TrainerConfig` tree.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


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


def _token(path: str | None) -> str | None:
    from dressage.proxy.config import ADMIN_TOKEN_ENV

    if path:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    return os.environ.get(ADMIN_TOKEN_ENV) or None


def _run(args: argparse.Namespace) -> int:
    from dressage.train.remote import ProxyTrajectorySource, consume

    cfg = trainer_config(args)
    source = ProxyTrajectorySource(cfg.proxy.url, token=_token(cfg.proxy.admin_token_file),
                                   timeout_s=max(cfg.timeout_s, 5.0))
    try:
        report = consume(source, dp_size=cfg.dp_size, expect_sessions=cfg.expect_sessions,
                         timeout_s=cfg.timeout_s, on_lost=cfg.on_lost)
    finally:
        source.close()
    width = max(len(k) for k in report)
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    verdict = "OK" if report["tq_keys_left"] == 0 else "KEYS LEFT"
    print(f"dressage trainer: {verdict}: {report['samples']} Samples restored and checked "
          f"from {report['sessions']} trajectories", file=sys.stderr)
    if cfg.json:
        with open(cfg.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0 if report["tq_keys_left"] == 0 else 1
