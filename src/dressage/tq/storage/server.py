"""StorageUnit server: a ZMQ ROUTER in front of any backend, and the process entry point of a unit.

Run as ``python -m dressage.tq.storage.server --unit-id unit0 ...``: it binds, prints one line
``READY <address> <pid>`` on stdout (and its metrics URL with ``--metrics-port``) and serves until SIGTERM/SIGINT or until its parent dies. With
``$DRESSAGE_TQ_SECRET`` set, every message must carry a valid MAC (see ``wire.sign``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from dressage.errors import KeyNotFoundError, ProtocolError
from dressage.tq.transport.bulk_rpc import BulkServer
from dressage.tq.storage.integrity import Checksums, block_rows_for
from dressage.tq.transport.shm import SHM_MIN_BYTES, ShmRegistry, host_id
from dressage.tq.storage.base import StorageUnit
from dressage.tq.storage.config import UNIT_MAX_MESSAGE, UNIT_ZMQ_MAX_MESSAGE
from dressage.tq.transport.zmq import RpcServer
from dressage.tq.transport.wire import (MAX_KEY_BYTES, max_keys, MAX_NBYTES, PayloadMac, PayloadTag, array_from_frame,
                                        array_meta, check_dtype, text, text_list, uint)

__all__ = ["StorageUnitServer", "main"]


_MAX_DIM = 1 << 48
_MAX_NDIM = 32
_MAX_ROW = 1 << 62
HEARTBEAT_MAX_MESSAGE = 64 * 1024  # the probe socket reads ping frames only (ZMQ_MAXMSGSIZE)
INVENTORY_PAGE = 20_000  # keys per ``inventory`` answer
GET_REPLY_BYTES = 256 << 20  # payload bytes per ``get`` answer (a larger single blob goes alone)


def _key(value: Any) -> str:
    return text(value, "key", max_len=MAX_KEY_BYTES, empty=False)


def _keys(value: Any) -> list[str]:
    return text_list(value, "keys")


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not 0 < len(value) <= _MAX_NDIM or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= _MAX_DIM for d in value):
        raise ProtocolError(f"bad shape {value!r:.80}")
    return tuple(value)


def _row(value: Any, what: str) -> int | None:
    if value is None and what == "stop":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not -_MAX_ROW <= value <= _MAX_ROW:
        raise ProtocolError(f"row {what} must be an integer in [-2**62, 2**62], got {value!r:.40}")
    return value


def _given_sums(value: Any, dtype: np.dtype, shape: tuple[int, ...]) -> Checksums:
    """A writer's checksums of the segment it wrote, ``[block_rows, digests as little-endian u64
    bytes]``: the unit's own block rule for this shape, one digest per block, or ProtocolError."""
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], bytes)
            and isinstance(value[0], int) and not isinstance(value[0], bool)):
        raise ProtocolError("a segment's checksums are [block_rows, digests]")
    block_rows = block_rows_for(shape, dtype.itemsize)
    blocks = -(-shape[0] // block_rows)
    if value[0] != block_rows or len(value[1]) != 8 * blocks:
        raise ProtocolError(f"a segment's checksums must be {blocks} blocks of {block_rows} rows")
    return Checksums(block_rows, np.frombuffer(value[1], dtype="<u8").astype(np.uint64))


class StorageUnitServer:
    """Serves one backend over ZMQ; ops: put, get, delete, exists, list, inventory, info, stats, ping."""

    def __init__(self, backend: StorageUnit, *, host: str = "127.0.0.1", port: int = 0,
                 shared_memory: bool = True, shm_token: str | None = None, secret: bytes | None = None,
                 max_message_bytes: int = UNIT_MAX_MESSAGE, bulk: bool = True,
                 max_reply_bytes: int = GET_REPLY_BYTES, metrics_port: int | None = None) -> None:
        self.backend = backend
        self.max_reply_bytes = int(max_reply_bytes)
        self._metrics_host, self._metrics_port = host, metrics_port
        self.metrics: Any = None
        """The unit's Prometheus endpoint (``metrics_port`` not ``None``) once its side sockets run."""
        self.host_id = host_id() if shared_memory else None
        unheld = getattr(backend, "unheld_bytes", None)  # freed segments count against the unit's budget
        self.shm = ShmRegistry(shm_token, room=unheld) if self.host_id else None
        self.rpc = RpcServer(self._handle, host=host, port=port, name=f"unit {backend.unit_id}", secret=secret,
                             max_message_bytes=min(max_message_bytes, UNIT_ZMQ_MAX_MESSAGE) if bulk
                             else max_message_bytes)
        # Checksums a put's writer did not compute are hashed after its reply, before the next request.
        self.rpc.after_reply = getattr(backend, "seal", None)
        # Liveness probes get their own socket and thread: a ping queued behind a multi-GiB put would
        # make a busy unit look dead. A stopped or killed process answers neither.
        self.heartbeat = RpcServer(self._beat, host=host, port=0, name=f"unit {backend.unit_id} heartbeat",
                                   secret=secret, max_message_bytes=HEARTBEAT_MAX_MESSAGE)
        # Large puts and gets: a TCP stream that receives payloads straight into the unit's own buffers.
        self.bulk = BulkServer(self._serve, host=host, port=0, name=f"unit {backend.unit_id} bulk", secret=secret,
                               max_message_bytes=max_message_bytes, alloc=self._receive_buffer,
                               tagged=True) if bulk else None
        if secret is not None and hasattr(backend, "check_tag"):  # a blob kept with its tag is checked by it
            backend.check_tag = lambda blob, tag: PayloadMac.check(secret, tag, blob)
        if self.bulk is not None:
            self.bulk.after_reply = self.rpc.after_reply

    def _receive_buffer(self, nbytes: int) -> Any:
        """Where a streamed payload lands: with shared memory on, a segment of this unit from
        ``SHM_MIN_BYTES`` up (a put from another host that readers here can then map), else the backend's
        own buffer. A message that fails its checks drops the buffer, which releases the segment."""
        if self.shm is not None and nbytes >= SHM_MIN_BYTES:
            buf = self.shm.receive_buffer(nbytes)
            if buf is not None:
                return buf
        return self.backend.receive_buffer(nbytes)

    @property
    def address(self) -> str:
        return self.rpc.address

    def start(self) -> "StorageUnitServer":
        self.start_side_sockets()
        self.rpc.start()
        return self

    def start_side_sockets(self) -> None:
        """The heartbeat and bulk sockets (each on its own thread), and the metrics endpoint."""
        if self._metrics_port is not None and self.metrics is None:
            from dressage.observe.metrics import serve_metrics
            from dressage.tq.metrics import unit_registry

            self.metrics = serve_metrics(unit_registry(self._unit_stats), self._metrics_host, self._metrics_port)
        self.heartbeat.start()
        if self.bulk is not None:
            self.bulk.start()

    def serve(self) -> None:
        self.start_side_sockets()
        self.rpc.serve()

    def _unit_stats(self) -> dict[str, Any]:
        return {**self.backend.stats(), **(self.shm.stats() if self.shm else {})}

    @property
    def metrics_url(self) -> str | None:
        return None if self.metrics is None else self.metrics.url

    def stop_side_sockets(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        self.heartbeat.stop()
        if self.bulk is not None:
            self.bulk.stop()

    def stop(self) -> None:
        self.rpc.stop()
        self.stop_side_sockets()
        if self.shm is not None:
            self.shm.close()  # unlink names; mappings (ours and readers') stay valid until dropped

    def describe(self) -> dict[str, Any]:
        unit = self.backend
        return {"unit_id": unit.unit_id, "node_id": unit.node_id, "memory_budget": unit.memory_budget,
                "supports_spill": unit.supports_spill, "pid": os.getpid(), "address": self.address,
                "host_id": self.host_id, "shm_token": self.shm.token if self.shm else None,
                "heartbeat": self.heartbeat.address, "bulk_port": self.bulk.port if self.bulk else None,
                "checksums": bool(getattr(unit, "checksums", False)), "metrics": self.metrics_url}

    def _page(self, requests: list[tuple[str, int, int | None]]) -> int:
        """How many of ``requests``, from the first, one get answer serves: their blobs' whole sizes (an
        upper bound of the rows asked for) within ``max_reply_bytes``, and at least one."""
        total = 0
        for i, (key, _, _) in enumerate(requests):
            try:
                total += self.backend.info(key).nbytes
            except KeyNotFoundError:
                continue  # get_many names it
            if total > self.max_reply_bytes and i > 0:
                return i
        return len(requests)

    def _beat(self, control: dict[str, Any], frames: list[Any]) -> tuple[dict[str, Any], Sequence[Any]]:
        if control["op"] != "ping" or frames:
            raise ProtocolError("the heartbeat socket answers only ping")
        return {"served": self.rpc.served + (self.bulk.served if self.bulk else 0)}, ()

    def _handle(self, control: dict[str, Any], frames: list[Any]) -> tuple[dict[str, Any], Sequence[Any]]:
        reply, payloads, _ = self._serve(control, frames, None)
        return reply, payloads

    def _serve(self, control: dict[str, Any], frames: list[Any],
               tags: list[PayloadTag | None] | None) -> tuple[dict[str, Any], Sequence[Any], list[Any] | None]:
        """One request; ``tags`` (an authenticated bulk message): a put keeps its payloads' tags with the
        blobs, a get forwards them."""
        op = control["op"]
        if op == "put":
            return self._put(control, frames, tags), (), None
        if op == "get":
            return self._get(control, tagged=tags is not None)
        return self._other(op, control), (), None

    def _put(self, control: dict[str, Any], frames: list[Any], tags: list[PayloadTag | None] | None) -> dict[str, Any]:
        unit = self.backend
        items = control.get("items")
        if not isinstance(items, list) or not 0 < len(items) <= max_keys():
            raise ProtocolError(f"put needs a list of 1 to {max_keys()} items")
        framed = sum(1 for i in items if isinstance(i, list) and len(i) == 3)
        if framed != len(frames):
            raise ProtocolError(f"put declares {framed} payload frames, the message has {len(frames)}")
        arrays: list[Any] = []
        sums: list[Checksums | None] = []
        kept: list[PayloadTag | None] = []
        next_frame = iter(range(len(frames)))
        in_segments: dict[str, list[tuple[int, int, np.dtype, tuple[int, ...]]]] = {}
        for item in items:
            given, tag = None, None
            if isinstance(item, list) and len(item) == 3:
                f = next(next_frame)
                array = array_from_frame(frames[f], item[1], item[2])
                tag = tags[f] if tags is not None else None
            elif isinstance(item, list) and len(item) in (4, 5, 6) and self.shm is not None:
                dtype, shape = check_dtype(item[1]), _shape(item[2])
                if len(item) >= 5 and item[4] is not None:  # hashed by the writer: the unit reads no byte
                    given = _given_sums(item[4], dtype, shape)
                offset = uint(item[5], "offset", MAX_NBYTES) if len(item) == 6 else 0
                name = text(item[3], "segment", max_len=255)
                in_segments.setdefault(name, []).append((len(arrays), offset, dtype, shape))
                array = None  # mapped below, once per segment
            else:
                raise ProtocolError("put items are [key, dtype, shape] or [key, dtype, shape, segment"
                                    "(, checksums(, offset))]")
            arrays.append((_key(item[0]), array))
            sums.append(given)
            kept.append(tag)
        # The fields of one segment (a step's small fields behind its large one) are views of one map.
        for name, parts in in_segments.items():
            views = self.shm.adopt_parts(name, [(o, d, s) for _, o, d, s in parts])  # type: ignore[union-attr]
            for (i, _, _, _), view in zip(parts, views):
                arrays[i] = (arrays[i][0], view)
        # Received frames and adopted segments are ours alone: the unit keeps them without copying.
        infos = unit.put_many(arrays, copy=False, sums=sums, tags=kept if tags is not None else None)
        return {"infos": [[i.key, i.dtype, list(i.shape), i.nbytes, i.spilled] for i in infos]}

    def _get(self, control: dict[str, Any], *, tagged: bool) -> tuple[dict[str, Any], list[Any], list[Any] | None]:
        unit = self.backend
        reqs = control.get("reqs")
        if not isinstance(reqs, list) or len(reqs) > max_keys() or not all(
                isinstance(r, list) and len(r) == 3 for r in reqs):
            raise ProtocolError(f"'reqs' must be a list of at most {max_keys()} [key, start, stop]")
        requests = [(_key(k), _row(a, "start"), _row(b, "stop")) for k, a, b in reqs]
        use_shm = control.get("shm") is True and self.shm is not None
        # Only for a reader that said it verifies what it maps (one that did not is sent verified rows).
        shm_reads = getattr(unit, "shm_reads", None) if use_shm and control.get("verify") is True else None
        if shm_reads is not None and requests:
            # The reader maps the rows and checks them against these digests: no byte is read here.
            plans = shm_reads(requests, self.shm.locate)  # type: ignore[union-attr]
            if plans is not None:
                return {"arrays": plans}, [], None
        # One answer carries at most max_reply_bytes (and always one array): the reader asks again
        # for the rest, so no request makes the unit build an answer of unbounded size.
        page = requests[:self._page(requests)]
        # A tag travels with bytes only: a reader on this host may be answered with a segment's name, so
        # then every blob is read (and verified) here.
        get_tagged = getattr(unit, "get_tagged", None) if tagged and not use_shm else None
        reads = get_tagged(page) if get_tagged is not None else [(a, None) for a in unit.get_many(page)]
        metas, payloads, forwarded = [], [], []
        for a, tag in reads:
            where = self.shm.locate(a) if use_shm else None  # type: ignore[union-attr]
            if where is None:
                metas.append(array_meta(a))
                payloads.append(a)
                forwarded.append(tag)
            else:
                metas.append([*array_meta(a), where[0], where[1]])
        return {"arrays": metas}, payloads, forwarded if any(forwarded) else None

    def _other(self, op: str, control: dict[str, Any]) -> dict[str, Any]:
        unit = self.backend
        if op == "delete":
            return {"removed": unit.delete(_keys(control.get("keys")))}
        if op == "exists":
            return {"exists": unit.exists(_key(control.get("key")))}
        if op == "list":
            return {"keys": unit.list()}
        if op == "inventory":  # paged, so no answer grows with the number of keys
            start = uint(control.get("start", 0), "start", 1 << 62)
            items = unit.inventory()
            page = items[start:start + INVENTORY_PAGE]
            more = start + INVENTORY_PAGE < len(items)
            return {"items": [[k, n] for k, n in page], "next": start + INVENTORY_PAGE if more else None}
        if op == "info":
            info = unit.info(_key(control.get("key")))
            return {"info": [info.key, info.dtype, list(info.shape), info.nbytes, info.spilled]}
        if op == "stats":
            stats = {**unit.stats(), **(self.shm.stats() if self.shm else
                                        {"shm_segments": 0, "shm_bytes": 0, "shm_free_segments": 0, "shm_free_bytes": 0})}
            if "held_bytes" in stats:  # the free segments are this unit's host memory too
                stats["held_bytes"] += stats["shm_free_bytes"]
            bulk = self.bulk
            return {"stats": stats, "pid": os.getpid(), "rejected": self.rpc.rejected + (bulk.rejected if bulk else 0),
                    "untyped": self.rpc.untyped + (bulk.untyped if bulk else 0)}
        if op == "describe":
            return self.describe()
        if op == "ping":
            return {}
        raise ProtocolError(f"unknown op {op!r:.40}")


def watch_parent(stop: threading.Event, parent_pid: int) -> None:
    """Stop when the parent process is gone, so no unit outlives its deployment."""
    def run() -> None:
        while not stop.wait(0.5):
            if os.getppid() != parent_pid:
                stop.set()
    threading.Thread(target=run, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    from dressage.tq.config import SECRET_ENV
    from dressage.tq.storage import make_storage_unit

    from dressage.flags import ConfigTree
    from dressage.tq.storage.config import UnitProcessConfig

    cfg = ConfigTree(UnitProcessConfig).parse_args(argv, prog="python -m dressage.tq.storage.server")
    if cfg.log_format != "text":
        from dressage.observe.logs import configure_logging

        configure_logging(cfg.log_format, process=f"storage-unit {cfg.unit_id}")
    backend = make_storage_unit(cfg.unit_id, node_id=cfg.node_id, memory_budget=cfg.memory_budget,
                                on_full=cfg.on_full, spill_dir=cfg.spill_dir, checksums=cfg.checksums)
    srv = cfg.server
    server = StorageUnitServer(backend, host=srv.host, port=srv.port, shared_memory=srv.shared_memory,
                               shm_token=srv.shm_token, secret=(os.environ.get(SECRET_ENV) or "").encode() or None,
                               max_message_bytes=srv.max_message_bytes, metrics_port=cfg.metrics_port)
    server.start_side_sockets()

    def cleanup() -> None:
        server.stop_side_sockets()
        if server.shm is not None:
            server.shm.close()
        backend.close()

    ready = f"READY {server.address} {os.getpid()}" + (f" {server.metrics_url}" if server.metrics_url else "")
    return serve_until_signalled(server.rpc, cleanup, ready)


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
