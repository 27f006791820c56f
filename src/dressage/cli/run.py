"""``dressage run``: the main job (placeholder round-trip until the online path lands)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the rollout -> training data-plane loop on the embedded default")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    print("dressage run: not wired yet")
    return 0
