"""Memory StorageUnit that spills to a local directory when a put does not fit its budget.

A blob that does not fit in memory is written to ``<dir>/<n>.blob`` (to a temporary name first, then
renamed, so a failed write leaves nothing); reads of spilled blobs read only the requested rows with
``pread``. Nothing is lost: a spill that cannot be written is StorageFullError and nothing is stored.
The file ends with the blob's block checksums; a read pulls the whole blocks its rows touch and verifies
them, so a flipped byte on disk is IntegrityError, on in-process reads too (``read_local`` sends every
spilled key through that path: the file is outside the unit's memory).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dressage.errors import ConfigError, IntegrityError, StorageFullError
from dressage.tq.storage.integrity import Checksums, checksum, verify_blocks
from dressage.tq.storage.base import BlobInfo
from dressage.tq.storage.memory import MemoryStorageUnit
from dressage.fields.refs import dtype_name

__all__ = ["SpillStorageUnit"]


@dataclass(frozen=True, slots=True)
class _Spilled:
    path: str
    dtype: np.dtype
    shape: tuple[int, ...]
    nbytes: int
    sums: Checksums | None


class SpillStorageUnit(MemoryStorageUnit):
    supports_spill = True
    remote = False

    def __init__(self, unit_id: str, *, node_id: str | None = None, memory_budget: int = 4 << 30,
                 spill_dir: str | os.PathLike[str] | None = None, checksums: bool = True,
                 verify_local_reads: bool = False) -> None:
        super().__init__(unit_id, node_id=node_id, memory_budget=memory_budget, checksums=checksums,
                         verify_local_reads=verify_local_reads)
        if spill_dir is None:
            self._dir = tempfile.mkdtemp(prefix=f"dressage-tq-{unit_id}-")
            self._owns_dir = True
        else:
            self._dir = os.path.join(os.fspath(spill_dir), unit_id)
            self._owns_dir = not os.path.exists(self._dir)
            try:
                os.makedirs(self._dir, mode=0o700, exist_ok=True)
                os.chmod(self._dir, 0o700)  # spilled blobs are trajectory data: their owner's alone
            except OSError as exc:
                raise ConfigError(f"transfer_queue.spill_dir: unit {unit_id} cannot create its directory "
                                  f"{self._dir!r}: {exc.strerror or exc}") from None
        self._spilled: dict[str, _Spilled] = {}
        self._spilled_bytes = 0
        self._seq = itertools.count()

    @property
    def spill_dir(self) -> str:
        return self._dir

    def _write(self, key: str, array: np.ndarray, *, copy: bool, sums: Checksums | None = None,
               tag: Any = None) -> BlobInfo:
        # docstring inherited
        if self._fits(array.nbytes):
            return super()._write(key, array, copy=copy, sums=sums, tag=tag)
        path = os.path.join(self._dir, f"{next(self._seq)}.blob")
        tmp = path + ".tmp"
        if not self.checksums:
            sums = None
        elif sums is None:
            sums = checksum(array)
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "wb") as f:
                array.tofile(f)  # contiguous: written straight from the array's buffer
                if sums is not None:
                    f.write(sums.to_bytes())  # the checksums travel with the bytes they cover
            os.replace(tmp, path)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise StorageFullError(
                f"unit {self.unit_id}: {array.nbytes} bytes for key {key!r} fit neither the memory budget "
                f"nor the spill directory {self._dir}: {exc}"
            ) from exc
        self._spilled[key] = _Spilled(path, array.dtype, tuple(array.shape), array.nbytes, sums)
        self._spilled_bytes += array.nbytes
        return BlobInfo(key, dtype_name(array.dtype), tuple(array.shape), array.nbytes, spilled=True)

    def _read(self, key: str, start: int, stop: int) -> np.ndarray:
        # docstring inherited
        blob = self._spilled.get(key)
        if blob is None:
            return super()._read(key, start, stop)
        if stop <= start:
            out = np.empty((0, *blob.shape[1:]), dtype=blob.dtype)
            out.flags.writeable = False
            return out
        row_bytes = blob.nbytes // blob.shape[0] if blob.shape[0] else 0
        # Read the whole blocks the rows touch (a block is one row without checksums).
        block_rows = blob.sums.block_rows if blob.sums is not None else 1
        first = start // block_rows
        lo, hi = first * block_rows, min(((stop - 1) // block_rows + 1) * block_rows, blob.shape[0])
        want = (hi - lo) * row_bytes
        buf = bytearray(want)
        try:
            fd = os.open(blob.path, os.O_RDONLY)
            try:
                got = os.preadv(fd, [buf], lo * row_bytes) if want else 0
            finally:
                os.close(fd)
        except OSError as exc:  # removed or unreadable behind the unit's back: lost, like a corrupted file
            raise IntegrityError(f"unit {self.unit_id}: spilled blob of key {key!r} cannot be read from "
                                 f"{blob.path}: {exc.strerror or exc}") from None
        if got != want:
            raise IntegrityError(f"unit {self.unit_id}: spilled blob of key {key!r} is truncated ({got} of {want} bytes)")
        rows = np.frombuffer(buf, dtype=blob.dtype).reshape((hi - lo, *blob.shape[1:]))
        if blob.sums is not None:
            verify_blocks(rows, blob.sums, first, f"unit {self.unit_id}, spilled key {key!r} ({blob.path})")
        out = rows[start - lo:stop - lo]
        out.flags.writeable = False
        return out

    def _has(self, key: str) -> bool:
        # docstring inherited
        return key in self._blobs or key in self._spilled

    def _info(self, key: str) -> BlobInfo | None:
        # docstring inherited
        blob = self._spilled.get(key)
        if blob is None:
            return super()._info(key)
        return BlobInfo(key, dtype_name(blob.dtype), blob.shape, blob.nbytes, spilled=True)

    def delete(self, keys: Iterable[str]) -> int:
        # docstring inherited
        keys = list(keys)
        with self._lock:
            removed = super().delete(keys)
            for key in keys:
                blob = self._spilled.pop(key, None)
                if blob is not None:
                    self._spilled_bytes -= blob.nbytes
                    try:
                        os.unlink(blob.path)
                    except FileNotFoundError:
                        pass
                    removed += 1
                    self._counts["deletes"] += 1
        return removed

    def exists(self, key: str) -> bool:
        # docstring inherited
        with self._lock:
            return key in self._spilled or super().exists(key)

    def list(self) -> list[str]:
        # docstring inherited
        with self._lock:
            return super().list() + list(self._spilled)

    def usage(self) -> dict[str, int]:
        # docstring inherited
        with self._lock:
            mem = super().usage()
            return {**mem, "keys": mem["keys"] + len(self._spilled), "bytes": mem["bytes"] + self._spilled_bytes,
                    "spilled_bytes": self._spilled_bytes}

    def close(self) -> None:
        # docstring inherited
        with self._lock:
            super().close()
            self._spilled.clear()
            self._spilled_bytes = 0
            if self._owns_dir:
                shutil.rmtree(self._dir, ignore_errors=True)
            else:
                for name in os.listdir(self._dir) if os.path.isdir(self._dir) else ():
                    if name.endswith((".blob", ".blob.tmp")):
                        os.unlink(os.path.join(self._dir, name))
