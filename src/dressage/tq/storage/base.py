"""The StorageUnit interface: a small key -> array store that holds TransferQueue payload bytes.

The abstract core is six methods (``_write``, ``_read``, ``_info``, ``delete``, ``exists``, ``list``);
``put``, ``get``, ``get_many`` and ``stats`` are built on it once here, with validation and counters.
A missing key is always :class:`KeyNotFoundError`; rows outside a blob are :class:`RowRangeError`.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dressage.errors import KeyNotFoundError, ProtocolError, RowRangeError, TransferQueueError
from dressage.tq.transport.wire import is_plain_dtype

__all__ = ["StorageUnit", "BlobInfo", "RowRequest", "prepare_array"]

# (key, row_start, row_stop): one read; row_stop None means to the end of the blob.
RowRequest = tuple[str, int, "int | None"]


@dataclass(frozen=True, slots=True)
class BlobInfo:
    """What a unit knows about one stored blob."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    spilled: bool = False


def prepare_array(array: Any, *, copy: bool) -> np.ndarray:
    """A C-contiguous, native-endian, plain-dtype array with at least one axis (the rows)."""
    if not isinstance(array, np.ndarray):
        array = np.asarray(array)
    if not is_plain_dtype(array.dtype):
        raise ProtocolError(f"dtype {array.dtype} is not a plain numeric dtype; TransferQueue stores raw bytes only")
    if array.ndim == 0:
        raise RowRangeError("a stored field needs at least one axis (its rows); got a 0-d array")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
        copy = False  # astype already made a private copy
    if copy:
        return np.array(array, order="C", copy=True)
    return np.ascontiguousarray(array)


class StorageUnit(ABC):
    """Holds blobs under a memory budget. Thread-safe; every method may be called from any thread."""

    #: the unit may move blobs to disk instead of refusing a put over budget
    supports_spill: ClassVar[bool] = False
    #: the bytes live in another process; ``get`` results arrive over a socket
    remote: ClassVar[bool] = False
    #: ``delete`` is supported (every backend so far)
    supports_deletes: ClassVar[bool] = True

    def __init__(self, unit_id: str, *, node_id: str | None = None, memory_budget: int = 4 << 30) -> None:
        self.unit_id = unit_id
        self.node_id = node_id
        self.memory_budget = int(memory_budget)
        self._lock = threading.RLock()
        self._counts = {"puts": 0, "bytes_written": 0, "get_requests": 0, "rows_read": 0, "bytes_read": 0,
                        "deletes": 0}

    # -- abstract core -------------------------------------------------------------------------
    @abstractmethod
    def _write(self, key: str, array: np.ndarray, *, copy: bool, sums: Any = None, tag: Any = None) -> BlobInfo:
        """Store a prepared array under a new key; raise StorageFullError leaving nothing behind. ``sums``:
        the blob's :class:`~dressage.tq.storage.integrity.Checksums` when its writer computed them (a handed-over
        buffer, ``copy=False``), so the unit need not read the bytes to hash them. ``tag``: the
        ``wire.PayloadTag`` its writer sent it with (a received frame), for a backend that keeps it."""

    @abstractmethod
    def _read(self, key: str, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of a key already checked to exist and to hold those rows."""

    @abstractmethod
    def _info(self, key: str) -> BlobInfo | None:
        """The blob's info, or ``None`` when the key is not stored."""

    @abstractmethod
    def delete(self, keys: Iterable[str]) -> int:
        """Remove keys; keys that are not stored are ignored. Returns how many were removed."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether the key is stored."""

    @abstractmethod
    def list(self) -> list[str]:
        """Every stored key."""

    @abstractmethod
    def usage(self) -> dict[str, int]:
        """``{"keys", "bytes", "memory_bytes", "spilled_bytes"}`` right now."""

    def receive_buffer(self, nbytes: int) -> np.ndarray:
        """A writable uint8 buffer of ``nbytes`` to receive a payload into, for ``put(copy=False)``;
        backends with a buffer pool hand out a recycled one (pages already faulted in)."""
        return np.empty(nbytes, dtype=np.uint8)

    # -- built on the core ---------------------------------------------------------------------
    def put(self, key: str, array: np.ndarray, *, copy: bool = True) -> BlobInfo:
        """Store ``array`` under ``key`` (a new key). ``copy=False`` lets the unit keep the caller's
        buffer: pass it only when the caller will never write to that buffer again."""
        return self.put_many([(key, array)], copy=copy)[0]

    def put_many(self, items: Sequence[tuple[str, np.ndarray]], *, copy: bool = True,
                 sums: Sequence[Any] | None = None, tags: Sequence[Any] | None = None) -> list[BlobInfo]:
        """Store several new keys, all or nothing: if one fails, none stays stored. ``sums`` and ``tags``:
        per item, its writer's checksums and payload tag, or None (see ``_write``)."""
        prepared = []
        for key, array in items:
            if not isinstance(key, str) or not key:
                raise ProtocolError(f"a key must be a non-empty string, got {key!r:.80}")
            data = prepare_array(array, copy=False)
            # A conversion (contiguity, byte order, list input) already made a private array: no second copy.
            prepared.append((key, data, copy and data is array))
        if len(prepared) > 1 and len({k for k, _, _ in prepared}) != len(prepared):
            raise TransferQueueError("put_many got the same key twice")
        infos: list[BlobInfo] = []
        with self._lock:
            for key, _, _ in prepared:
                if self._has(key):
                    raise TransferQueueError(f"key {key!r} is already stored in unit {self.unit_id}; keys are write-once")
            try:
                for i, (key, data, private_copy) in enumerate(prepared):
                    given = None if sums is None or private_copy else sums[i]
                    tag = None if tags is None or private_copy else tags[i]
                    infos.append(self._write(key, data, copy=private_copy, sums=given, tag=tag))
            except BaseException:
                self.delete([i.key for i in infos])
                raise
            counts = self._counts
            counts["puts"] += len(infos)
            for i in infos:
                counts["bytes_written"] += i.nbytes
        return infos

    def _has(self, key: str) -> bool:
        """Whether ``key`` is stored (called under the lock; backends answer it without a BlobInfo)."""
        return self._info(key) is not None

    def inventory(self) -> list[tuple[str, int]]:
        """Every stored key with its size in bytes: what a restarted Controller rebuilds its directory from."""
        out = []
        for key in self.list():
            with self._lock:
                info = self._info(key)
            if info is not None:  # deleted since the listing
                out.append((key, info.nbytes))
        return out

    def info(self, key: str) -> BlobInfo:
        with self._lock:
            info = self._info(key)
        if info is None:
            raise KeyNotFoundError(f"key {key!r} not found in unit {self.unit_id}")
        return info

    def get(self, key: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` of ``key`` as a read-only array (``stop=None``: to the end)."""
        return self.get_many([(key, start, stop)])[0]

    def get_many(self, requests: Sequence[RowRequest]) -> list[np.ndarray]:
        """Each request's rows, in order. Every key and range is checked before any read."""
        with self._lock:
            plans = self._plan(requests)
            out = [self._read(key, start, stop) for key, start, stop in plans]
            self._count_read(plans, out)
        return out

    def _plan(self, requests: Sequence[RowRequest]) -> list[tuple[str, int, int]]:
        """``requests`` with each stop resolved, once every key and row range was found (under the lock)."""
        plans = []
        missing = []
        for key, start, stop in requests:
            info = self._info(key)
            if info is None:
                missing.append(key)
                continue
            rows = info.shape[0]
            stop_ = rows if stop is None else int(stop)
            if not 0 <= int(start) <= stop_ <= rows:
                raise RowRangeError(
                    f"key {key!r} in unit {self.unit_id}: rows [{start}, {stop_}) outside stored [0, {rows})"
                )
            plans.append((key, int(start), stop_))
        if missing:
            raise KeyNotFoundError(
                f"{len(missing)} key(s) not found in unit {self.unit_id}: {', '.join(map(repr, missing[:8]))}"
            )
        return plans

    def _count_read(self, plans: Sequence[tuple[str, int, int]], out: Sequence[np.ndarray]) -> None:
        self._counts["get_requests"] += 1
        self._counts["rows_read"] += sum(stop - start for _, start, stop in plans)
        self._counts["bytes_read"] += sum(a.nbytes for a in out)

    def read_local(self, requests: Sequence[RowRequest]) -> list[np.ndarray]:
        """:meth:`get_many` for a reader in this process that keeps the read-only results (the in-process
        client). A backend may skip re-verifying bytes it copied into its own memory here (see
        ``MemoryStorageUnit``); anything else it returns is verified as ``get_many`` verifies it."""
        return self.get_many(requests)

    def stats(self) -> dict[str, Any]:
        """Usage plus counters: keys, bytes, memory_bytes, spilled_bytes, budget, puts, get_requests, ..."""
        with self._lock:
            out: dict[str, Any] = {"unit_id": self.unit_id, "node_id": self.node_id,
                                   "backend": type(self).__name__, "memory_budget": self.memory_budget}
            out.update(self.usage())
            out.update(self._counts)
        return out

    def close(self) -> None:
        """Release resources (spill files, sockets). The unit is unusable afterwards."""

    async def aget_many(self, requests: Sequence[RowRequest]) -> list[np.ndarray]:
        return await asyncio.to_thread(self.get_many, requests)

    def __enter__(self) -> "StorageUnit":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
