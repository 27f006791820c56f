"""In-process memory StorageUnit: blobs are numpy arrays in a dict, under a byte budget.

Large buffers freed by ``delete`` are kept in a small pool and reused by later puts of the same size:
fresh pages cost a page fault each (several times a memcpy), and RL steps write blobs of recurring sizes.
A buffer is reused only when no reader still holds a view of it, and pooled bytes count against the
budget (they are evicted before a put would push held bytes over it). Every blob carries per-row-block
checksums (``tq/storage/integrity.py``), computed while copying it in. ``get_many`` (what a unit server sends to
other processes, and any direct read) verifies them on every read; ``read_local`` (the in-process client)
skips that for blobs the unit copied into its own read-only memory unless ``verify_local_reads`` is set.
Blobs it kept without copying (received frames, adopted shared-memory segments) are verified on every
read either way: another process wrote, and may still map, those bytes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from dressage.errors import IntegrityError, StorageFullError, TransferQueueError
from dressage.tq.storage.integrity import Checksums, block_span, checksum, copy_and_checksum, verify_rows
from dressage.tq.storage.base import BlobInfo, RowRequest, StorageUnit
from dressage.fields.refs import dtype_name
from dressage.tq.transport.landing import landing, landing_view
from dressage.tq.transport.wire import PayloadTag

__all__ = ["MemoryStorageUnit"]

_POOL_MIN_BLOB = 1 << 20       # smaller buffers come from malloc's own free lists
_POOL_MAX_BYTES = 1 << 30      # upper bound of idle pooled bytes (also at most a quarter of the budget)


class MemoryStorageUnit(StorageUnit):
    supports_spill = False
    remote = False

    def __init__(self, unit_id: str, *, node_id: str | None = None, memory_budget: int = 4 << 30,
                 checksums: bool = True, verify_local_reads: bool = False) -> None:
        super().__init__(unit_id, node_id=node_id, memory_budget=memory_budget)
        self.checksums = checksums
        self.verify_local_reads = verify_local_reads
        self._blobs: dict[str, np.ndarray] = {}
        self._sums: dict[str, Checksums | None] = {}
        self._adopted: set[str] = set()  # kept without a copy: verified on in-process reads too
        self._memory_bytes = 0
        self._peak_held = 0
        self._pool: dict[int, list[np.ndarray]] = {}  # blob bytes -> idle owning buffers (``landing``)
        self._pooled_bytes = 0
        self._pool_cap = min(_POOL_MAX_BYTES, memory_budget // 4)
        self._unsealed: set[str] = set()  # handed-over blobs whose checksums ``seal`` still computes
        # Blobs received with their writer's tag (``wire.PayloadTag``): a whole-blob read over the bulk stream
        # forwards it (``get_tagged``) and reads no byte here; the checksums, for any other read, are computed
        # by the first that needs them, once ``check_tag`` found the bytes still the ones their writer tagged.
        self._tags: dict[str, PayloadTag] = {}
        self._tag_first: set[str] = set()
        self.check_tag: Callable[[np.ndarray, PayloadTag], bool] | None = None
        """Set by a server that holds the deployment's secret: whether a blob's bytes match a tag."""

    def _fits(self, nbytes: int) -> bool:
        return self._memory_bytes + nbytes <= self.memory_budget

    def unheld_bytes(self) -> int:
        """What the budget leaves after the blobs and idle buffers held now. Lock-free (two reads of ints),
        so a shared-memory segment released from any thread may ask it."""
        return self.memory_budget - self._memory_bytes - self._pooled_bytes

    def _take_pooled(self, nbytes: int) -> np.ndarray | None:
        """An idle pooled buffer of exactly ``nbytes``, writable again, or None (under the lock). A size
        whose last buffer goes leaves the pool, so eviction never meets an empty list."""
        free = self._pool.get(nbytes)
        if not free:
            return None
        self._pooled_bytes -= nbytes
        owner = free.pop()
        if not free:
            del self._pool[nbytes]
        owner.flags.writeable = True
        return landing_view(owner, nbytes)

    def _alloc(self, nbytes: int) -> np.ndarray:
        buf = self._take_pooled(nbytes)
        if buf is not None:
            return buf
        self._evict_pool(nbytes)
        return landing(nbytes)

    def receive_buffer(self, nbytes: int) -> np.ndarray:
        # docstring inherited: a pooled buffer of exactly this size when one is idle. Stored as received
        # (``put(copy=False)`` keeps it as the blob's base), it goes back to the pool when deleted.
        if nbytes >= _POOL_MIN_BLOB:
            with self._lock:
                buf = self._take_pooled(nbytes)
            if buf is not None:
                return buf
        return landing(nbytes)

    def _evict_pool(self, nbytes: int) -> None:
        """Free idle pooled buffers until ``nbytes`` more keep held bytes within the budget."""
        while self._pool and self._memory_bytes + self._pooled_bytes + nbytes > self.memory_budget:
            size = max(self._pool)
            self._pool[size].pop()
            if not self._pool[size]:
                del self._pool[size]
            self._pooled_bytes -= size

    def _write(self, key: str, array: np.ndarray, *, copy: bool, sums: Checksums | None = None,
               tag: PayloadTag | None = None) -> BlobInfo:
        # docstring inherited
        nbytes = array.nbytes
        if self._memory_bytes + nbytes > self.memory_budget:  # not self._fits: one call less per put
            raise StorageFullError(
                f"unit {self.unit_id} is full: {nbytes} bytes for key {key!r} do not fit "
                f"({self._memory_bytes} of {self.memory_budget} bytes used)"
            )
        if copy:
            if nbytes >= _POOL_MIN_BLOB:
                buf = self._alloc(nbytes)
            else:
                self._evict_pool(nbytes)
                buf = np.empty(nbytes, dtype=np.uint8)
            if self.checksums:
                sums = copy_and_checksum(buf, array)  # hashed block by block in the copy
            else:
                buf[:] = array.reshape(-1).view(np.uint8)
                sums = None
            buf.flags.writeable = False  # readers get views; nobody may change stored bytes
            stored = buf.view(array.dtype).reshape(array.shape)  # a view of a read-only buffer: read-only
        else:
            self._evict_pool(nbytes)
            stored = array  # the caller handed the buffer over (a received frame, an adopted segment)
            self._adopted.add(key)
            if tag is not None:
                self._tags[key] = tag
            if not self.checksums:
                sums = None
            elif sums is None and tag is not None and self.check_tag is not None:
                self._tag_first.add(key)  # hashed, its tag checked first, by the first read that needs it
            elif sums is None:  # hashed by ``seal`` (a server calls it once the put is answered) or the first read
                self._unsealed.add(key)
            stored.flags.writeable = False
        self._blobs[key] = stored
        self._sums[key] = sums
        self._memory_bytes += nbytes
        held = self._memory_bytes + self._pooled_bytes
        if held > self._peak_held:
            self._peak_held = held
        return BlobInfo(key, dtype_name(stored.dtype), stored.shape, nbytes)

    def put_local(self, key: str, array: np.ndarray, *, copy: bool = True) -> BlobInfo:
        """``put`` of one array already prepared (``prepare_array``) by the in-process client."""
        with self._lock:
            if self._has(key):
                raise TransferQueueError(f"key {key!r} is already stored in unit {self.unit_id}; keys are write-once")
            info = self._write(key, array, copy=copy)
            self._counts["puts"] += 1
            self._counts["bytes_written"] += info.nbytes
        return info

    def _poolable(self, buf: object, nbytes: int) -> bool:
        return (isinstance(buf, np.ndarray) and buf.dtype == np.uint8 and buf.ndim == 1 and buf.flags.owndata
                and nbytes >= _POOL_MIN_BLOB and self._pooled_bytes + nbytes <= self._pool_cap
                and landing_view(buf, nbytes).nbytes == nbytes)

    def seal(self) -> None:
        """Compute the checksums of the blobs put with ``copy=False`` since the last call. A server calls
        this after answering each request, before it reads the next: a put's reply does not wait for the
        hash, and no read can come before it."""
        with self._lock:
            for key in self._unsealed:
                self._sums[key] = checksum(self._blobs[key])
            self._unsealed.clear()

    def _sealed_sums(self, key: str, blob: np.ndarray) -> Checksums | None:
        """``key``'s checksums, computed now if ``seal`` has not come yet (a read before it), or for a blob
        kept with its writer's tag, once the tag matches (else IntegrityError, on this read and every later one)."""
        if key in self._unsealed:
            self._unsealed.discard(key)
            self._sums[key] = checksum(blob)
        elif key in self._tag_first:
            if not self.check_tag(blob, self._tags[key]):  # type: ignore[misc]
                raise IntegrityError(f"unit {self.unit_id}, key {key!r}: the stored bytes are not the ones their "
                                     "writer tagged; they are corrupted")
            self._tag_first.discard(key)
            self._sums[key] = checksum(blob)
        return self._sums[key]

    def get_tagged(self, requests: Sequence[RowRequest]) -> list[tuple[np.ndarray, PayloadTag | None]]:
        """``get_many`` for a reader over the authenticated bulk stream: a whole blob kept with its writer's
        tag comes with that tag, unread here (the reader checks the bytes against it); every other request
        is read, and verified, as ``get_many`` reads it (with None)."""
        with self._lock:
            plans = self._plan(requests)
            out: list[tuple[np.ndarray, PayloadTag | None]] = []
            for key, start, stop in plans:
                blob, tag = self._blobs.get(key), self._tags.get(key)
                if tag is not None and blob is not None and start == 0 and stop == blob.shape[0]:
                    out.append((blob, tag))
                else:
                    out.append((self._read(key, start, stop), None))
            self._count_read(plans, [a for a, _ in out])
        return out

    def _read(self, key: str, start: int, stop: int) -> np.ndarray:
        # docstring inherited
        blob = self._blobs[key]
        sums = self._sealed_sums(key, blob)
        if sums is not None:
            verify_rows(blob, sums, start, stop, f"unit {self.unit_id}, key {key!r}")
        return blob[start:stop]

    def shm_reads(self, requests: Sequence[RowRequest],
                  locate: Callable[[np.ndarray], tuple[str, int] | None]) -> list[list[Any]] | None:
        """A get for a reader on this host that maps the rows itself and verifies them: per request
        ``[dtype, shape, segment, byte offset, [rows before, block rows mapped, block_rows, first block,
        digests]]`` (the whole blocks its rows touch and their stored digests; without checksums the last
        item is None), read from no byte of the segment here. None when any request is not a non-empty
        row range of an in-memory blob on a segment (``locate``): the caller reads the verifying way."""
        out = []
        nrows = nbytes = 0
        with self._lock:
            for key, start, stop in requests:
                blob = self._blobs.get(key)
                if blob is None or not blob.ndim:
                    return None
                rows = blob.shape[0]
                stop = rows if stop is None else stop
                if not 0 <= start < stop <= rows:
                    return None
                where = locate(blob)
                if where is None:
                    return None
                sums = self._sealed_sums(key, blob)
                row_bytes = blob.nbytes // rows
                check = None
                if sums is not None:
                    first, last, lo, hi = block_span(start, stop, sums.block_rows, rows)
                    check = [start - lo, hi - lo, sums.block_rows, first,
                             sums.digests[first:last + 1].astype("<u8").tobytes()]
                out.append([dtype_name(blob.dtype), [stop - start, *blob.shape[1:]], where[0],
                            where[1] + start * row_bytes, check])
                nrows += stop - start
                nbytes += (stop - start) * row_bytes
            counts = self._counts
            counts["get_requests"] += 1
            counts["rows_read"] += nrows
            counts["bytes_read"] += nbytes
        return out

    def read_local(self, requests: Sequence[RowRequest]) -> list[np.ndarray]:
        # docstring inherited
        blobs, adopted, out = self._blobs, self._adopted, []
        nrows = nbytes = 0
        with self._lock:
            verify_all = self.verify_local_reads
            for key, start, stop in requests:
                blob = blobs.get(key)
                rows = -1 if blob is None else blob.shape[0]
                if stop is None:
                    stop = rows
                if not 0 <= start <= stop <= rows:
                    # Spilled, missing or out of range: the checked, verifying path (and its errors).
                    return self.get_many(requests)
                if verify_all or key in adopted:
                    sums = self._sealed_sums(key, blob)
                    if sums is not None:
                        verify_rows(blob, sums, start, stop, f"unit {self.unit_id}, key {key!r}")
                view = blob[start:stop]  # read-only: stored blobs are never writeable
                out.append(view)
                nrows += stop - start
                nbytes += view.nbytes
            counts = self._counts
            counts["get_requests"] += 1
            counts["rows_read"] += nrows
            counts["bytes_read"] += nbytes
        return out

    def _has(self, key: str) -> bool:
        # docstring inherited
        return key in self._blobs

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
                del self._sums[key]
                self._adopted.discard(key)
                self._unsealed.discard(key)
                self._tags.pop(key, None)
                self._tag_first.discard(key)
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
                    "spilled_bytes": 0, "pooled_bytes": self._pooled_bytes,
                    "held_bytes": self._memory_bytes + self._pooled_bytes, "peak_held_bytes": self._peak_held}

    def close(self) -> None:
        # docstring inherited
        with self._lock:
            self._blobs.clear()
            self._sums.clear()
            self._adopted.clear()
            self._unsealed.clear()
            self._tags.clear()
            self._tag_first.clear()
            self._pool.clear()
            self._memory_bytes = self._pooled_bytes = 0
