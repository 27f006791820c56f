"""StorageUnit server: a ZMQ ROUTER in front of any backend, and the process entry point of a unit.

Run as ``python -m dressage.tq.storage.server --unit-id unit0 ...``: it binds, prints one line
``READY <address> <pid>`` on stdout and serves until SIGTERM/SIGINT or until its parent dies.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from dressage.errors import ProtocolError
from dressage.tq.storage.base import StorageUnit
from dressage.tq.transport import RpcServer
from dressage.tq.wire import array_from_frame, array_meta

__all__ = ["StorageUnitServer", "main"]


def _key(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"key must be a non-empty string, got {value!r:.80}")
    return value


def _keys(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise ProtocolError("'keys' must be a list")
    return [_key(k) for k in value]


def _row(value: Any, what: str) -> int | None:
    if value is None and what == "stop":
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"row {what} must be an integer, got {value!r:.40}")
    return value


class StorageUnitServer:
    """Serves one backend over ZMQ; ops: put, get, delete, exists, list, info, stats, ping."""

    def __init__(self, backend: StorageUnit, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.backend = backend
        self.rpc = RpcServer(self._handle, host=host, port=port, name=f"unit {backend.unit_id}")

    @property
    def address(self) -> str:
        return self.rpc.address

    def start(self) -> "StorageUnitServer":
        self.rpc.start()
        return self

    def serve(self) -> None:
        self.rpc.serve()

    def stop(self) -> None:
        self.rpc.stop()

    def _handle(self, control: dict[str, Any], frames: list[Any]) -> tuple[dict[str, Any], Sequence[Any]]:
        op = control["op"]
        unit = self.backend
        if op == "put":
            items = control.get("items")
            if not isinstance(items, list) or not items or len(items) != len(frames):
                raise ProtocolError(f"put carries one payload frame per item ({len(frames)} frames)")
            arrays = []
            for item, frame in zip(items, frames):
                if not isinstance(item, list) or len(item) != 3:
                    raise ProtocolError("put items are [key, dtype, shape]")
                arrays.append((_key(item[0]), array_from_frame(frame, item[1], item[2])))
            # The received frames are ours alone: the unit may keep them without copying.
            infos = unit.put_many(arrays, copy=False)
            return {"infos": [[i.key, i.dtype, list(i.shape), i.nbytes, i.spilled] for i in infos]}, ()
        if op == "get":
            reqs = control.get("reqs")
            if not isinstance(reqs, list) or not all(isinstance(r, list) and len(r) == 3 for r in reqs):
                raise ProtocolError("'reqs' must be a list of [key, start, stop]")
            arrays = unit.get_many([(_key(k), _row(a, "start"), _row(b, "stop")) for k, a, b in reqs])
            return {"arrays": [array_meta(a) for a in arrays]}, arrays
        if op == "delete":
            return {"removed": unit.delete(_keys(control.get("keys")))}, ()
        if op == "exists":
            return {"exists": unit.exists(_key(control.get("key")))}, ()
        if op == "list":
            return {"keys": unit.list()}, ()
        if op == "info":
            info = unit.info(_key(control.get("key")))
            return {"info": [info.key, info.dtype, list(info.shape), info.nbytes, info.spilled]}, ()
        if op == "stats":
            return {"stats": unit.stats(), "pid": os.getpid(), "rejected": self.rpc.rejected}, ()
        if op == "describe":
            return {"unit_id": unit.unit_id, "node_id": unit.node_id, "memory_budget": unit.memory_budget,
                    "supports_spill": unit.supports_spill, "pid": os.getpid()}, ()
        if op == "ping":
            return {}, ()
        raise ProtocolError(f"unknown op {op!r:.40}")


def watch_parent(stop: threading.Event, parent_pid: int) -> None:
    """Stop when the parent process is gone, so no unit outlives its deployment."""
    def run() -> None:
        while not stop.wait(0.5):
            if os.getppid() != parent_pid:
                stop.set()
    threading.Thread(target=run, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    from dressage.tq.storage import make_storage_unit

    p = argparse.ArgumentParser(prog="python -m dressage.tq.storage.server")
    p.add_argument("--unit-id", required=True)
    p.add_argument("--node-id", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--memory-budget", type=int, required=True)
    p.add_argument("--on-full", default="spill", choices=("spill", "wait", "error"))
    p.add_argument("--spill-dir", default=None)
    args = p.parse_args(argv)
    backend = make_storage_unit(args.unit_id, node_id=args.node_id, memory_budget=args.memory_budget,
                                on_full=args.on_full, spill_dir=args.spill_dir)
    server = StorageUnitServer(backend, host=args.host, port=args.port)
    return serve_until_signalled(server.rpc, backend.close, f"READY {server.address} {os.getpid()}")


def serve_until_signalled(rpc: RpcServer, cleanup: Any, ready_line: str) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    watch_parent(stop, os.getppid())
    rpc.start()
    print(ready_line, flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        rpc.stop()
        cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
