"""A StorageUnit reached over ZMQ: the client side of ``storage/server.py``.

Each call is one round trip; put sends the array's buffer without copying it, get returns read-only
arrays viewing the received bytes. Puts of 64 KiB and more and every get go over the unit's bulk stream
(``tq/transport/bulk.py``: payloads received in place, the unit's into its recycled blob buffers, ours into a
:class:`~dressage.tq.transport.bulk.RecvPool`); the rest over ZMQ. On the unit's own host, payloads of 256 KiB and more go through
/dev/shm instead (see ``tq/transport/shm.py``): one copy to write (hashed by block as it is written, the digests
sent with the put so the unit never reads the segment to hash it), none to read; the segment names
travel on the bulk stream too. A put's small fields ride in the tail of its first large field's
segment when they fit its size class, and a get's rows of a segment are verified here, against the
digests the unit sends with the name (the unit reads no byte of it). Silence beyond ``timeout_s`` is
StorageUnitUnavailable naming the unit and the keys, and so is any call once the Controller has marked
the unit dead (``attach_liveness``): the wait ends within ~0.2 s of that, not at the timeout.
"""

from __future__ import annotations

import itertools
import math
import secrets
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from dressage.errors import IntegrityError, ProtocolError
from dressage.tq.transport import shm
from dressage.tq.transport.bulk_rpc import BulkClient
from dressage.tq.storage.integrity import Checksums, verify_blocks
from dressage.tq.storage.base import BlobInfo, RowRequest, StorageUnit, prepare_array
from dressage.tq.transport.zmq import RpcClient
from dressage.tq.transport.wire import MAX_KEYS, array_from_frame, check_dtype, key_pages, max_keys
from dressage.fields.refs import dtype_name

__all__ = ["RemoteStorageUnit", "BULK_MIN_BYTES"]

# Puts carrying at least this many socket payload bytes take the bulk stream; smaller ones stay on ZMQ.
BULK_MIN_BYTES = 64 * 1024


def _never() -> None:
    return None


def _checked_span(value: Any, dtype: np.dtype, shape: tuple[int, ...]) -> tuple[int, int, Checksums, int]:
    """A get reply's block span for rows a reader maps and verifies: ``[rows before, block rows mapped,
    block_rows, first block, digests]`` -> (rows before, rows mapped, checksums, first block)."""
    if not (isinstance(value, list) and len(value) == 5 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                 for v in value[:4]) and isinstance(value[4], bytes)):
        raise ProtocolError("a segment read's digests are [rows before, rows, block_rows, first block, digests]")
    before, rows, block_rows, first, digests = value
    n = len(digests) // 8
    if (before < 0 or block_rows <= 0 or first < 0 or len(digests) % 8 or not shape
            or rows < before + shape[0] or n != -(-rows // block_rows) or n > MAX_KEYS * 64):
        raise ProtocolError("a segment read's block span does not fit its rows")
    # Digests indexed from block 0, as ``verify_blocks`` reads them.
    full = np.zeros(first + n, dtype=np.uint64)
    full[first:] = np.frombuffer(digests, dtype="<u8")
    return before, rows, Checksums(block_rows, full), first


def _info(obj: Any) -> BlobInfo:
    key, dtype, shape, nbytes, spilled = obj
    return BlobInfo(key, dtype, tuple(shape), int(nbytes), bool(spilled))


class RemoteStorageUnit(StorageUnit):
    remote = True

    def __init__(self, unit_id: str, address: str, *, node_id: str | None = None,
                 memory_budget: int = 4 << 30, timeout_s: float = 30.0, supports_spill: bool = False,
                 host_id: str | None = None, shm_token: str | None = None, secret: bytes | None = None,
                 heartbeat: str | None = None, bulk_port: int | None = None, checksums: bool = True) -> None:
        super().__init__(unit_id, node_id=node_id, memory_budget=memory_budget)
        self.address = address
        self.heartbeat = heartbeat  # the unit's probe endpoint (see StorageUnitServer)
        self.host_id = host_id
        # Shared memory only with a unit on this very host (same /dev/shm) that offers it.
        self.shm_token = shm_token if shm_token and host_id and host_id == shm.host_id() else None
        # itertools.count is safe to share between threads (a generator expression is not).
        self._segment_prefix = secrets.token_hex(4)
        self._segment_seq = itertools.count()
        self.supports_spill = supports_spill  # instance value: whatever the backend behind it declares
        self._rpc = RpcClient(address, timeout_s=timeout_s, name=f"StorageUnit {unit_id}", secret=secret)
        self._secret = secret
        self._abort: Callable[[], str | None] | None = None
        self._bulk: BulkClient | None | bool = False  # False: not asked yet; None: the unit has no bulk port
        self._bulk_lock = threading.Lock()
        # Whether the unit keeps checksums, so a segment's writer hashes what it wrote (learned from the
        # unit's describe; until then assumed, and a unit without them ignores the digests).
        self._writer_sums = checksums
        if bulk_port:  # known from a describe already made: no second one
            self._bulk = self._make_bulk(bulk_port)

    def attach_liveness(self, check: Callable[[], str | None] | None) -> None:
        """``check()`` returns why the unit is dead, or None; every call fails fast while it says dead."""
        self._abort = check
        self._rpc.set_abort(check)
        if isinstance(self._bulk, BulkClient):
            self._bulk.set_abort(check)

    def _bulk_client(self, keys: Sequence[str]) -> BulkClient | None:
        """The unit's bulk stream (asked for once), on the host this unit's ZMQ address names; None
        when the unit has no bulk port."""
        if self._bulk is False:
            with self._bulk_lock:
                if self._bulk is False:
                    d = self._rpc.call("describe", keys=keys)[0]
                    self._writer_sums = d.get("checksums") is not False
                    self._bulk = self._make_bulk(d.get("bulk_port"))
        return self._bulk  # type: ignore[return-value]

    def _make_bulk(self, port: Any) -> BulkClient | None:
        return BulkClient.beside(self.address, port, timeout_s=self._rpc.timeout_s, name=self._rpc.name,
                                 secret=self._secret, abort=self._abort)

    @classmethod
    def describe(cls, unit_id: str, address: str, *, timeout_s: float = 30.0,
                 secret: bytes | None = None) -> "RemoteStorageUnit":
        """Connect and ask the server what it is (node, budget, capabilities)."""
        probe = RpcClient(address, timeout_s=timeout_s, name=f"StorageUnit {unit_id}", secret=secret)
        try:
            d, _ = probe.call("describe")
        finally:
            probe.close()
        return cls(d["unit_id"], address, node_id=d.get("node_id"), memory_budget=int(d["memory_budget"]),
                   timeout_s=timeout_s, supports_spill=bool(d.get("supports_spill")), host_id=d.get("host_id"),
                   shm_token=d.get("shm_token"), secret=secret, heartbeat=d.get("heartbeat"),
                   bulk_port=d.get("bulk_port"), checksums=d.get("checksums") is not False)

    @property
    def uses_shared_memory(self) -> bool:
        return self.shm_token is not None

    # The server validates and counts; these overrides make each call a single round trip.
    def put_many(self, items: Sequence[tuple[str, np.ndarray]], *, copy: bool = True) -> list[BlobInfo]:
        # docstring inherited
        if len(items) <= max_keys():
            return self._put_page(items)
        # More items than one request may carry: one request per page (the caller aborts every key of a
        # put that fails, so a page stored before a later one failed is deleted with the rest).
        return [info for page in key_pages(list(items)) for info in self._put_page(page)]

    def _put_page(self, items: Sequence[tuple[str, np.ndarray]]) -> list[BlobInfo]:
        meta, frames, segments = [], [], []
        try:
            use_shm = self.shm_token is not None
            bulk = self._bulk_client([k for k, _ in items]) if use_shm else None  # describe once, before any write
            datas = [prepare_array(array, copy=False) for _, array in items]
            # A step's small fields go into the tail of the segment of its first large one (one claim,
            # one file, no frame for the unit to copy and hash), when they fit its size class.
            packed: dict[int, int] = {}
            first = next((i for i, d in enumerate(datas) if d.nbytes >= shm.SHM_MIN_BYTES), None) if use_shm else None
            if first is not None:
                small = [i for i, d in enumerate(datas) if d.nbytes < shm.SHM_MIN_BYTES]
                offsets = shm.pack_offsets(datas[first].nbytes, [datas[i].nbytes for i in small])
                packed = {i: off for i, off in zip(small, offsets) if off is not None}
            written: dict[int, list[Any]] = {}  # item index -> [segment, checksums, offset]
            for i, data in enumerate(datas):
                if not use_shm or data.nbytes < shm.SHM_MIN_BYTES:
                    continue
                name = f"dtq-{self.shm_token}-{self._segment_prefix}{next(self._segment_seq):x}"
                parts = [(0, i)] + ([(off, j) for j, off in packed.items()] if i == first else [])
                try:
                    # Hashed block by block as written (the source still in cache), so the unit
                    # stores the digests without reading the segment.
                    sums = shm.write_segment_parts(name, [(off, datas[j]) for off, j in parts], self.shm_token,
                                                   checksums=self._writer_sums)
                except OSError:  # /dev/shm full or unavailable: these items go over the socket
                    continue
                segments.append(name)
                for (off, j), sm in zip(parts, sums):
                    wire_sums = None if sm is None else [sm.block_rows, sm.digests.astype("<u8").tobytes()]
                    written[j] = [name, wire_sums, off]
            for (key, _), data in zip(items, datas):
                item = [key, dtype_name(data.dtype), list(data.shape)]
                seg = written.get(len(meta))
                if seg is None:
                    frames.append(data)  # sent straight from the caller's buffer
                elif seg[2]:
                    item.extend(seg)  # [segment, checksums or None, offset]
                else:
                    item.append(seg[0])
                    if seg[1] is not None:
                        item.append(seg[1])
                meta.append(item)
            keys = [m[0] for m in meta]
            if not segments and sum(f.nbytes for f in frames) < BULK_MIN_BYTES:
                bulk = None
            elif bulk is None:
                bulk = self._bulk_client(keys)
            if bulk is not None:
                reply, _ = bulk.call("put", {"items": meta}, frames, keys=keys)
            else:
                reply, _ = self._rpc.call("put", {"items": meta}, frames, keys=keys)
        except BaseException:
            for name in segments:  # the unit unlinks what it adopted; this covers what it never saw
                shm.remove_segment(name)
            raise
        return [_info(i) for i in reply["infos"]]

    def get_many(self, requests: Sequence[RowRequest]) -> list[np.ndarray]:
        # docstring inherited
        reqs = [[k, int(a), None if b is None else int(b)] for k, a, b in requests]
        out: list[np.ndarray] = []
        while len(out) < len(reqs):
            # At most max_keys() requests per call; the unit answers a page of them bounded by bytes,
            # from the first, and the rest are asked for again.
            out.extend(self._get_page(reqs[len(out):len(out) + max_keys()]))
        return out

    def _get_page(self, reqs: list[list[Any]]) -> list[np.ndarray]:
        keys = [r[0] for r in reqs]
        bulk = self._bulk_client(keys)
        if bulk is not None:  # received into pooled buffers (see ``bulk.RecvPool``); segments as names
            # ``verify``: this reader checks the rows it maps against the digests sent with their names.
            try:
                reply, frames = bulk.call("get", {"reqs": reqs, "shm": self.shm_token is not None, "verify": True},
                                          keys=keys)
            except IntegrityError as exc:  # a blob that failed its writer's tag (read_message)
                shown = ", ".join(map(repr, keys[:8])) + (" ..." if len(keys) > 8 else "")
                raise IntegrityError(f"StorageUnit {self.unit_id}, reading {shown}: {exc}") from exc
        else:
            reply, frames = self._rpc.call("get", {"reqs": reqs, "shm": self.shm_token is not None}, keys=keys)
        metas = reply.get("arrays")
        if not isinstance(metas, list) or len(metas) > len(reqs) or (reqs and not metas):
            raise ProtocolError(f"StorageUnit {self.unit_id}: get reply does not match its {len(reqs)} requests")
        out: list[Any] = []
        checks: list[tuple[int, Any]] = []
        next_frame = iter(frames)
        in_segments: dict[str, list[tuple[int, int, np.dtype, tuple[int, ...]]]] = {}
        try:
            for meta in metas:
                if len(meta) == 2:
                    a = array_from_frame(next(next_frame), meta[0], meta[1])
                    a.flags.writeable = False
                elif len(meta) in (4, 5) and isinstance(meta[3], int) and meta[3] >= 0:
                    # Rows of one segment (a step's fields) are mapped once, below; with digests (5 items)
                    # the whole blocks the rows touch, checked here before anything is returned.
                    dtype, shape, offset = check_dtype(meta[0]), tuple(meta[1]), meta[3]
                    check = _checked_span(meta[4], dtype, shape) if len(meta) == 5 and meta[4] is not None else None
                    if check is not None:
                        before, span_rows = check[0], check[1]
                        row_bytes = dtype.itemsize * math.prod(shape[1:])
                        offset -= before * row_bytes
                        if offset < 0:
                            raise ProtocolError(f"StorageUnit {self.unit_id}: bad block span {meta!r:.80}")
                        shape = (span_rows, *shape[1:])
                    in_segments.setdefault(meta[2], []).append((len(out), offset, dtype, shape))
                    checks.append((len(out), check))
                    a = None
                else:
                    raise ProtocolError(f"StorageUnit {self.unit_id}: bad array descriptor {meta!r:.80}")
                out.append(a)
        except StopIteration:
            raise ProtocolError(f"StorageUnit {self.unit_id}: get reply has too few payload frames") from None
        for name, parts in in_segments.items():
            for (i, _, _, _), a in zip(parts, shm.map_segment_parts(name, [(o, d, s) for _, o, d, s in parts])):
                a.flags.writeable = False
                out[i] = a
        for i, check in checks:
            if check is None:
                continue
            before, _, sums, first = check
            what = f"StorageUnit {self.unit_id} (segment read on this host), key {reqs[i][0]!r}"
            verify_blocks(out[i], sums, first, what)
            out[i] = out[i][before:before + int(metas[i][1][0])]  # the rows asked for
        return out

    def info(self, key: str) -> BlobInfo:
        # docstring inherited
        reply, _ = self._rpc.call("info", {"key": key}, keys=[key])
        return _info(reply["info"])

    def _write(self, key: str, array: np.ndarray, *, copy: bool, sums: Any = None, tag: Any = None) -> BlobInfo:
        # docstring inherited
        return self.put_many([(key, array)])[0]

    def _read(self, key: str, start: int, stop: int) -> np.ndarray:
        # docstring inherited
        return self.get_many([(key, start, stop)])[0]

    def _info(self, key: str) -> BlobInfo | None:
        # docstring inherited
        return self.info(key) if self.exists(key) else None

    def delete(self, keys: Iterable[str]) -> int:
        # docstring inherited
        removed = 0
        for page in key_pages(list(keys)):
            reply, _ = self._rpc.call("delete", {"keys": page}, keys=page)
            removed += int(reply["removed"])
        return removed

    def exists(self, key: str) -> bool:
        # docstring inherited
        reply, _ = self._rpc.call("exists", {"key": key}, keys=[key])
        return bool(reply["exists"])

    def list(self) -> list[str]:
        # docstring inherited
        # Through the paged inventory: one answer listing every key would grow with the unit's contents.
        return [key for key, _ in self.inventory()]

    def inventory(self) -> list[tuple[str, int]]:
        # docstring inherited
        out: list[tuple[str, int]] = []
        start: Any = 0
        while start is not None:
            reply, _ = self._rpc.call("inventory", {"start": start})
            items = reply.get("items")
            if not isinstance(items, list) or not all(
                    isinstance(i, list) and len(i) == 2 and isinstance(i[0], str) and isinstance(i[1], int)
                    for i in items):
                raise ProtocolError(f"{self.unit_id}: an inventory answer is a list of [key, nbytes]")
            out.extend((k, n) for k, n in items)
            nxt = reply.get("next")
            if nxt is not None and (not isinstance(nxt, int) or nxt <= start):
                raise ProtocolError(f"{self.unit_id}: an inventory answer names no later page")
            start = nxt
        return out

    def usage(self) -> dict[str, int]:
        # docstring inherited
        s = self.stats()
        return {k: s[k] for k in ("keys", "bytes", "memory_bytes", "spilled_bytes")}

    def stats(self) -> dict[str, Any]:
        # docstring inherited
        reply, _ = self._rpc.call("stats")
        out = dict(reply["stats"])
        out["pid"] = reply.get("pid")
        out["rejected_frames"] = reply.get("rejected", 0)
        out["untyped_errors"] = reply.get("untyped", 0)
        return out

    def ping(self, timeout_s: float | None = None) -> None:
        # A probe must reach the unit even while it is marked dead: that is how it comes back.
        self._rpc.call("ping", timeout_s=timeout_s, abort=_never)

    def close(self) -> None:
        # docstring inherited
        self._rpc.close()
        if isinstance(self._bulk, BulkClient):
            self._bulk.close()
