"""In-process memory StorageUnit: blobs are numpy arrays in a dict, under a byte budget.

Large buffers freed by ``delete`` are kept in a small pool and reused by later puts of the same size:
fresh pages cost a page fault each (several times a memcpy), and RL steps write blobs of recurring sizes.
A buffer is reused only when no reader still holds a view of it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import numpy as np

from dressage.errors import StorageFullError
from dressage.tq.storage.base import BlobInfo, StorageUnit
from dressage.tq.wire import dtype_name

__all__ = ["MemoryStorageUnit"]

_POOL_MIN_BLOB = 1 << 20       # smaller buffers come from malloc's own free lists
_POOL_MAX_BYTES = 1 << 30      # upper bound of idle pooled bytes (also at most a quarter of the budget)


class MemoryStorageUnit(StorageUnit):
    supports_spill = False
    remote = False

    def __init__(self, unit_id: str, *, node_id: str | None = None, memory_budget: int = 4 << 30) -> None:
        super().__init__(unit_id, node_id=node_id, memory_budget=memory_budget)
        self._blobs: dict[str, np.ndarray] = {}
        self._memory_bytes = 0
        self._pool: dict[int, list[np.ndarray]] = {}
        self._pooled_bytes = 0
        self._pool_cap = min(_POOL_MAX_BYTES, memory_budget // 4)

    def _fits(self, nbytes: int) -> bool:
        return self._memory_bytes + nbytes <= self.memory_budget

    def _alloc(self, nbytes: int) -> np.ndarray:
        free = self._pool.get(nbytes)
        if free:
            self._pooled_bytes -= nbytes
            buf = free.pop()
            buf.flags.writeable = True
            return buf
        return np.empty(nbytes, dtype=np.uint8)

    def _write(self, key: str, array: np.ndarray, *, copy: bool) -> BlobInfo:
        # docstring inherited
        nbytes = array.nbytes
        if not self._fits(nbytes):
            raise StorageFullError(
                f"unit {self.unit_id} is full: {nbytes} bytes for key {key!r} do not fit "
                f"({self._memory_bytes} of {self.memory_budget} bytes used)"
            )
        if copy:
            buf = self._alloc(nbytes) if nbytes >= _POOL_MIN_BLOB else np.empty(nbytes, dtype=np.uint8)
            stored = buf.view(array.dtype).reshape(array.shape)
            np.copyto(stored, array)
            buf.flags.writeable = False  # readers get views; nobody may change stored bytes
        else:
            stored = array  # the caller handed the buffer over (a received frame)
        stored.flags.writeable = False
        self._blobs[key] = stored
        self._memory_bytes += nbytes
        return BlobInfo(key, dtype_name(stored.dtype), tuple(stored.shape), nbytes)

    def _poolable(self, buf: object, nbytes: int) -> bool:
        return (isinstance(buf, np.ndarray) and buf.dtype == np.uint8 and buf.ndim == 1 and buf.flags.owndata
                and nbytes >= _POOL_MIN_BLOB and self._pooled_bytes + nbytes <= self._pool_cap)

    def _read(self, key: str, start: int, stop: int) -> np.ndarray:
        # docstring inherited
        return self._blobs[key][start:stop]

    def _info(self, key: str) -> BlobInfo | None:
        # docstring inherited
        a = self._blobs.get(key)
        return None if a is None else BlobInfo(key, dtype_name(a.dtype), tuple(a.shape), a.nbytes)

    def delete(self, keys: Iterable[str]) -> int:
        # docstring inherited
        removed = 0
        with self._lock:
            for key in keys:
                a = self._blobs.pop(key, None)
                if a is None:
                    continue
                removed += 1
                buf, nbytes = a.base, a.nbytes
                self._memory_bytes -= nbytes
                del a
                # Reuse only when no reader holds a view: the two refs are ``buf`` and getrefcount's argument.
                if self._poolable(buf, nbytes) and sys.getrefcount(buf) == 2:
                    self._pool.setdefault(nbytes, []).append(buf)  # type: ignore[arg-type]
                    self._pooled_bytes += nbytes
                del buf
            self._counts["deletes"] += removed
        return removed

    def exists(self, key: str) -> bool:
        # docstring inherited
        with self._lock:
            return key in self._blobs

    def list(self) -> list[str]:
        # docstring inherited
        with self._lock:
            return list(self._blobs)

    def usage(self) -> dict[str, int]:
        # docstring inherited
        with self._lock:
            return {"keys": len(self._blobs), "bytes": self._memory_bytes, "memory_bytes": self._memory_bytes,
                    "spilled_bytes": 0, "pooled_bytes": self._pooled_bytes}

    def close(self) -> None:
        # docstring inherited
        with self._lock:
            self._blobs.clear()
            self._pool.clear()
            self._memory_bytes = self._pooled_bytes = 0
