"""``dressage tq serve``: the TransferQueue as a service of its own (Controller and StorageUnits).

Every flag is generated from :class:`dressage.tq.deploy.service.TqServeConfig`; the command serves until
SIGTERM or SIGINT. ``proxy serve --transfer-queue-spec FILE`` and trainers join it through the spec file.
"""

from __future__ import annotations

import argparse
import signal
import threading


def _tree():
    from dressage.flags import ConfigTree
    from dressage.tq.deploy.service import TqServeConfig

    return ConfigTree(TqServeConfig, yaml_flag=None)  # --config is the TransferQueue's own YAML


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tq", help="the TransferQueue as its own service (outlives Proxies and trainers)")
    tsub = p.add_subparsers(dest="tq_command", metavar="ACTION")
    tsub.required = True
    s = tsub.add_parser("serve", help="run the Controller and StorageUnits and write their client spec",
                        description="Start the TransferQueue --config names, write the client spec to "
                                    "--spec-out and serve until SIGTERM/SIGINT. deployment: local or ray run the "
                                    "Controller and each StorageUnit as processes of their own (a Controller that "
                                    "dies is started again); embedded serves them from this process over ZMQ.")
    _tree().add_to(s)
    s.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from dressage.tq.deploy.service import serve_transfer_queue

    config = _tree().build(args)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def ready(tq) -> None:
        units = tq.units()
        print(f"dressage tq: serving a {tq.deployment} TransferQueue: Controller {tq.client_spec()['controller']}, "
              f"{len(units)} StorageUnit(s); client spec in {config.spec_out}", flush=True)

    serve_transfer_queue(config, stop, ready)
    return 0
