"""In-process memory StorageUnit: blobs are numpy arrays in a dict, under a byte budget."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from dressage.errors import StorageFullError
from dressage.tq.storage.base import BlobInfo, StorageUnit

__all__ = ["MemoryStorageUnit"]


class MemoryStorageUnit(StorageUnit):
    supports_spill = False
    remote = False

    def __init__(self, unit_id: str, *, node_id: str | None = None, memory_budget: int = 4 << 30) -> None:
        super().__init__(unit_id, node_id=node_id, memory_budget=memory_budget)
        self._blobs: dict[str, np.ndarray] = {}
        self._memory_bytes = 0

    def _fits(self, nbytes: int) -> bool:
        return self._memory_bytes + nbytes <= self.memory_budget

    def _write(self, key: str, array: np.ndarray, *, copy: bool) -> BlobInfo:
        # docstring inherited
        if not self._fits(array.nbytes):
            raise StorageFullError(
                f"unit {self.unit_id} is full: {array.nbytes} bytes for key {key!r} do not fit "
                f"({self._memory_bytes} of {self.memory_budget} bytes used)"
            )
        stored = np.array(array, copy=True) if copy else array
        if stored.flags.writeable and stored.flags.owndata:
            stored.flags.writeable = False  # readers get views; nobody may change stored bytes
        self._blobs[key] = stored
        self._memory_bytes += stored.nbytes
        return BlobInfo(key, stored.dtype.name, tuple(stored.shape), stored.nbytes)

    def _read(self, key: str, start: int, stop: int) -> np.ndarray:
        # docstring inherited
        view = self._blobs[key][start:stop]
        view.flags.writeable = False
        return view

    def _info(self, key: str) -> BlobInfo | None:
        # docstring inherited
        a = self._blobs.get(key)
        return None if a is None else BlobInfo(key, a.dtype.name, tuple(a.shape), a.nbytes)

    def delete(self, keys: Iterable[str]) -> int:
        # docstring inherited
        removed = 0
        with self._lock:
            for key in keys:
                a = self._blobs.pop(key, None)
                if a is not None:
                    self._memory_bytes -= a.nbytes
                    removed += 1
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
            return {"keys": len(self._blobs), "bytes": self._memory_bytes,
                    "memory_bytes": self._memory_bytes, "spilled_bytes": 0}

    def close(self) -> None:
        # docstring inherited
        with self._lock:
            self._blobs.clear()
            self._memory_bytes = 0
