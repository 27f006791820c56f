"""``dressage capacity``: will this rollout batch fit on the master node, and from which batch size not.

Every flag is generated from the :class:`~dressage.capacity.CapacityConfig` tree; the library never
sees them.
"""

from __future__ import annotations

import argparse
import json


def _tree():
    from dressage.capacity import CapacityConfig
    from dressage.flags import ConfigTree

    return ConfigTree(CapacityConfig, omit=("model.vocab_size",))  # the vocabulary sizes nothing here


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capacity",
        help="size R3 and project the master-node data-plane peak with and without TQ",
        description="Size R3 and the trajectory fields of a rollout batch, and project the master-node "
                    "peak with and without TQ from a measured baseline (built in: the seed's published "
                    "Qwen3.6-35B-A3B figures).",
    )
    _tree().add_to(p)
    p.set_defaults(func=_run)


def config_from_args(args: argparse.Namespace):
    """The edge: flags (and ``--config`` file) -> validated config."""
    return _tree().build(args)


def _run(args: argparse.Namespace) -> int:
    from dressage.capacity import SEED_QWEN_BASELINE, capacity_report, load_baseline, plot_projection, render_text

    config = config_from_args(args)
    baseline = SEED_QWEN_BASELINE if config.baseline is None else load_baseline(config.baseline)
    report = capacity_report(config, baseline)
    if config.output.plot:
        report["plot"] = str(plot_projection(config, baseline, config.output.plot))
    if config.output.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_text(report))
        if config.output.plot:
            print(f"\nplot written to {report['plot']}")
    return 0
