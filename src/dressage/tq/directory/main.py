"""The Controller's process: ``python -m dressage.tq.directory.main --units JSON ...``.

It adopts the keys its units already hold (``recovery.py``), prints ``READY <address> <pid>`` once bound
(and its metrics URL with ``--metrics-port``), serves the directory (:class:`ControllerServer`, ZMQ and
its stream socket), sweeps deletions (``Janitor``) and probes its units (``LivenessMonitor``); with
``$DRESSAGE_TQ_SECRET`` set, every frame is authenticated.
"""

from __future__ import annotations

import json
import os
import sys

from dressage.tq.directory.controller import Controller

from dressage.tq.directory.entries import UnitInfo
from dressage.tq.directory.service import ControllerServer
from dressage.tq.directory.janitor import Janitor

__all__ = ["main"]

RECOVERY_TIMEOUT_S = 5.0  # how long a starting Controller waits for each unit's inventory


def main(argv: list[str] | None = None) -> int:
    from dressage.tq.config import SECRET_ENV
    from dressage.tq.directory.liveness import LivenessMonitor
    from dressage.tq.directory.recovery import LateAdoption, recover_directory
    from dressage.tq.storage.remote import RemoteStorageUnit
    from dressage.tq.storage.server import serve_until_signalled

    from dressage.flags import ConfigTree
    from dressage.tq.directory.config import ControllerProcessConfig

    prog = "python -m dressage.tq.directory.main"
    cfg = ConfigTree(ControllerProcessConfig).parse_args(argv, prog=prog)
    if cfg.log_format != "text":
        from dressage.observe.logs import configure_logging

        configure_logging(cfg.log_format, process="controller")
    live = cfg.liveness
    secret = (os.environ.get(SECRET_ENV) or "").encode() or None
    # '-': the launcher starts this process before its units are up, so the imports overlap their start.
    raw = sys.stdin.readline() if cfg.units == "-" else cfg.units
    try:
        wires = json.loads(raw)
        units = [UnitInfo.from_wire(u) for u in wires]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        print(f"{prog}: error: --units: expected a JSON list of unit descriptions ({exc})", file=sys.stderr)
        return 2
    controller = Controller(units, retention_s=cfg.retention_s, strict_budget=cfg.strict_budget)
    handles = {u.unit_id: RemoteStorageUnit(u.unit_id, u.address, node_id=u.node_id, timeout_s=live.timeout_s,
                                            secret=secret)
               for u in units if u.address}
    for uid, h in handles.items():  # a janitor delete on a unit found dead ends at once
        h.attach_liveness(lambda uid=uid: controller.dead_reason(uid))
    # A Controller started again over running units (its process died) takes their keys back first;
    # a unit that does not answer soon is reported and does not hold the start up: its keys are taken
    # in when it first answers a probe (``LateAdoption``).
    asked = {u.unit_id: RemoteStorageUnit(u.unit_id, u.address, timeout_s=min(live.timeout_s, RECOVERY_TIMEOUT_S),
                                          secret=secret) for u in units if u.address}
    unreachable = recover_directory(controller, asked).unreachable
    for uid, h in asked.items():
        if uid not in unreachable:
            h.close()
    late = LateAdoption(controller, {uid: asked[uid] for uid in unreachable})
    janitor = Janitor(controller, handles.get, interval_s=cfg.sweep_s).start()
    # Own sockets, to the units' heartbeat endpoints: neither a slow janitor delete nor a long client
    # request delays a probe.
    probes = {u.unit_id: RemoteStorageUnit(u.unit_id, u.heartbeat or u.address, timeout_s=live.dead_after_s,
                                           secret=secret) for u in units if u.address}
    monitor = LivenessMonitor(late, probes, interval_s=live.heartbeat_s,
                              dead_after_s=live.dead_after_s).start()
    server = ControllerServer(controller, host=cfg.host, port=cfg.port, janitor=janitor, secret=secret)
    server.start_stream()
    metrics = None
    if cfg.metrics_port is not None:
        from dressage.observe.metrics import serve_metrics
        from dressage.tq.metrics import controller_registry

        metrics = serve_metrics(controller_registry(controller.stats), cfg.host, cfg.metrics_port)

    def cleanup() -> None:
        if metrics is not None:
            metrics.close()
        if server.stream is not None:
            server.stream.stop()
        monitor.stop()
        for h in probes.values():
            h.close()
        late.close()
        janitor.stop()
        for h in handles.values():
            h.close()

    ready = f"READY {server.address} {os.getpid()}" + (f" {metrics.url}" if metrics is not None else "")
    return serve_until_signalled(server.rpc, cleanup, ready)


if __name__ == "__main__":
    sys.exit(main())
