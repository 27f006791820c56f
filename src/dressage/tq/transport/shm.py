"""Shared-memory fast path between processes on one host: payloads as files in /dev/shm.

A writer on the unit's host writes the array into ``/dev/shm/dtq-<unit token>-<n>`` (hashing each block
as it writes it) and sends only the name and the digests; the unit maps the file and keeps that mapping
as the stored blob (no copy). A reader on the same host gets ``(name, offset)`` back and maps the rows
read-only (no copy, no socket transfer). Only names with the unit's own prefix are ever opened.

Segments are recycled: a file's size is a power-of-two class (>= the payload), and when the unit drops its
last view of a blob it renames the file into its free pool instead of unlinking it, so the next put of
that class claims it by a rename and writes into pages tmpfs has already allocated (no fresh-page
zeroing). The pool is indexed by a one-page bitmap every process maps (``tq/transport/shm_pool.py``): a claim or a
release flips a bit under a lock and renames one file, without listing /dev/shm. A reader holds a shared
``flock`` on each segment it maps for as long as its view lives; a segment some reader still holds is
unlinked instead (that reader's mapping stays valid), so a recycled segment is never one a live view
shows, and a released segment's name is gone (mapping it again is KeyNotFoundError). The pool is bounded
(``SHM_POOL_BYTES`` of free segments per unit, ``shm_pool.SLOTS`` per class; beyond it a released file is
unlinked); with no free segment of the class a put creates a new file, and when /dev/shm is full the item
goes over the socket. Closing the unit removes every file with its token, free ones and the index
included.
"""

from __future__ import annotations

import fcntl
import glob
import itertools
import math
import mmap
import os
import re
import secrets
import socket
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from dressage.errors import KeyNotFoundError, ProtocolError
from dressage.tq.transport import landing, shm_pool
from dressage.tq.storage.integrity import Checksums, write_and_checksum

__all__ = ["SHM_DIR", "SHM_MIN_BYTES", "SHM_POOL_BYTES", "PART_ALIGN", "host_id", "new_token", "pack_offsets",
           "write_segment", "write_segment_parts", "map_segment", "map_segment_parts", "ShmRegistry",
           "remove_segment", "remove_segments", "segment_class", "free_segments"]

SHM_DIR = "/dev/shm"
# Below this a socket frame is cheaper than creating, mapping and unlinking a file.
SHM_MIN_BYTES = 256 * 1024
# Free (released) segments a unit keeps for reuse, in bytes; a release beyond this unlinks the file.
SHM_POOL_BYTES = 1 << 30
_NAME = re.compile(r"^dtq-[0-9a-f]{16}-[0-9a-z]+$")
_PAGE = mmap.PAGESIZE
# Where the small fields of a put start in the segment of its first large one (see ``pack_offsets``).
PART_ALIGN = 64


def host_id() -> str | None:
    """Identity of this host's /dev/shm (None when there is none): equal ids can share segments."""
    try:
        st = os.stat(SHM_DIR)
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return None
    return f"{socket.gethostname()}:{boot}:{st.st_dev}:{st.st_ino}"


def new_token() -> str:
    return secrets.token_hex(8)


def _path(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ProtocolError(f"bad shared-memory segment name {name!r:.80}")
    return os.path.join(SHM_DIR, name)


def segment_class(nbytes: int) -> int:
    """Size of the file that holds ``nbytes``: the next power of two, at least one page."""
    return max(_PAGE, 1 << max(int(nbytes) - 1, 0).bit_length())


def free_segments(token: str) -> list[str]:
    """Names of the free (recycled, unused) segments of one unit."""
    pool = shm_pool.pool_for(SHM_DIR, token)
    return pool.names() if pool is not None else []


def _claim(token: str, size: int, path: str) -> int | None:
    """Rename a free segment of this class to ``path`` and open it; None when the pool has none."""
    pool = shm_pool.pool_for(SHM_DIR, token)
    if pool is None or not pool.claim(size, path):
        return None
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    if os.fstat(fd).st_size == size:
        return fd
    os.close(fd)  # not a file this pool made: never reuse it
    os.unlink(path)
    return None


def pack_offsets(first_nbytes: int, sizes: list[int]) -> list[int | None]:
    """Offsets at which fields of ``sizes`` bytes fit behind a ``first_nbytes`` field in the segment that
    holds it, without making the file a larger class (None: that one does not fit, or is empty). A
    1.25 MiB R3 array lives in a 2 MiB segment: a step's logprobs fit in its tail."""
    cap = segment_class(first_nbytes)
    end, out = first_nbytes, []
    for n in sizes:
        off = -(-end // PART_ALIGN) * PART_ALIGN
        if n <= 0 or off + n > cap:
            out.append(None)
        else:
            out.append(off)
            end = off + n
    return out


def write_segment(name: str, array: np.ndarray, token: str | None = None, *,
                  checksums: bool = False) -> Checksums | None:
    """Write the array's bytes into segment ``name``, reusing a free segment of ``token``'s pool when there
    is one. The file is ``segment_class(nbytes)`` long. OSError if /dev/shm is full: the caller falls back
    to frames. With ``checksums``, returns the array's block checksums, each block hashed right after it
    was written (still in cache), else None."""
    return write_segment_parts(name, [(0, array)], token, checksums=checksums)[0]


def write_segment_parts(name: str, parts: list[tuple[int, np.ndarray]], token: str | None = None, *,
                        checksums: bool = False) -> list[Checksums | None]:
    """``write_segment`` for several arrays in one segment, each at its byte offset (the first at 0; see
    ``pack_offsets``): one claim, one file, one checksum list per array."""
    path = _path(name)
    size = segment_class(max(off + a.nbytes for off, a in parts))
    fd = _claim(token, size, path) if token else None
    sums: list[Checksums | None] = []
    try:
        if fd is None:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
            os.ftruncate(fd, size)
        for off, array in parts:
            if checksums:
                sums.append(write_and_checksum(
                    lambda piece, lo, off=off: shm_pool.pwrite_all(fd, piece, off + lo), array))
            else:
                shm_pool.pwrite_all(fd, memoryview(array.reshape(-1).view(np.uint8)), off)
                sums.append(None)
    except BaseException:
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        raise
    os.close(fd)
    return sums


def remove_segment(name: str) -> None:
    try:
        os.unlink(_path(name))
    except (FileNotFoundError, ProtocolError):
        pass


def remove_segments(token: str) -> int:
    """Remove every segment of one unit (leftovers of writers or units that died)."""
    n = 0
    for path in glob.glob(os.path.join(SHM_DIR, f"dtq-{token}-*")):
        try:
            os.unlink(path)
            n += 1
        except FileNotFoundError:
            pass
    return n


def map_segment(name: str, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Read-only array over ``shape`` elements at byte ``offset`` of a segment (the reader's side).

    The reader holds a shared lock on the segment while the array lives, so the unit never recycles it
    under this view."""
    nbytes = dtype.itemsize * math.prod(shape)
    start = (offset // _PAGE) * _PAGE
    path = _path(name)
    gone = f"shared-memory segment {name} is gone (its key was deleted)"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise KeyNotFoundError(gone) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:  # released (renamed into the pool) between the open and the lock: not this key's bytes
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            raise KeyNotFoundError(gone)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # fault the pages in at once
        mm = mmap.mmap(fd, offset - start + nbytes, flags, mmap.PROT_READ, offset=start)
    except BaseException:
        os.close(fd)
        raise
    weakref.finalize(mm, os.close, fd)  # closing the descriptor drops the lock
    return np.frombuffer(mm, dtype=dtype, count=math.prod(shape), offset=offset - start).reshape(shape)


def map_segment_parts(name: str, parts: list[tuple[int, np.dtype, tuple[int, ...]]]) -> list[np.ndarray]:
    """``map_segment`` for several arrays of one segment (``(offset, dtype, shape)`` each): one map
    from the first one's page to the last one's end, one lock, every array a view of it."""
    if len(parts) == 1:
        off, dtype, shape = parts[0]
        return [map_segment(name, off, dtype, shape)]
    lo = min(off for off, _, _ in parts)
    hi = max(off + dt.itemsize * math.prod(shape) for off, dt, shape in parts)
    whole = map_segment(name, lo, np.dtype(np.uint8), (hi - lo,))
    return [whole[off - lo:off - lo + dt.itemsize * math.prod(shape)].view(dt).reshape(shape)
            for off, dt, shape in parts]


def _release(name: str, token: str, pool_bytes: "int | Callable[[], int]") -> None:
    """The unit dropped its last view of a segment: into the free pool when no reader holds it and the
    pool has room for it (``pool_bytes``, or what it answers now), else unlink."""
    path = _path(name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    try:
        size = os.fstat(fd).st_size
        keep = size == segment_class(size)
        if keep:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a reader's view still shows it
                keep = False
        pool = shm_pool.pool_for(SHM_DIR, token) if keep else None
        limit = pool_bytes() if callable(pool_bytes) else pool_bytes
        if pool is None or not pool.release(path, size, limit):
            os.unlink(path)
    except OSError:
        remove_segment(name)
    finally:
        os.close(fd)


class ShmRegistry:
    """The unit's side: adopts segments as stored arrays and finds the segment behind a stored view."""

    def __init__(self, token: str | None = None, pool_bytes: int = SHM_POOL_BYTES,
                 room: Callable[[], int] | None = None) -> None:
        self.token = token or new_token()
        self.pool_bytes = pool_bytes
        # What the unit's budget leaves unheld, read when a segment is released (lock-free: a release
        # runs wherever the last view is dropped): freed segments count against the budget.
        self.room = room
        self.pool = shm_pool.create_pool(SHM_DIR, self.token)
        self._maps: "weakref.WeakKeyDictionary[mmap.mmap, tuple[str, int, int]]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._received = itertools.count()

    def owns(self, name: str) -> bool:
        # Free pool names and the pool's index (``-z``) are never a put's segment.
        return isinstance(name, str) and name.startswith(f"dtq-{self.token}-") and \
            not name.startswith(f"dtq-{self.token}-z")

    def adopt(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """Map a writer's segment as a read-only array; the file is unlinked once the array is garbage."""
        return self.adopt_parts(name, [(0, dtype, shape)])[0]

    def adopt_parts(self, name: str, parts: list[tuple[int, np.dtype, tuple[int, ...]]]) -> list[np.ndarray]:
        """Map a writer's segment once as read-only arrays at byte offsets (``(offset, dtype, shape)``;
        the first at 0, none overlapping, each offset a multiple of its itemsize, the file the class of
        their extent). They are views of one map: the segment is released when the last goes."""
        if not self.owns(name):
            raise ProtocolError(f"segment {name!r:.80} does not belong to this unit")
        path = _path(name)
        end = 0
        for i, (off, dtype, shape) in enumerate(sorted(parts, key=lambda p: p[0])):
            nbytes = dtype.itemsize * math.prod(shape)
            if nbytes == 0 or off < end or off % dtype.itemsize or (i == 0 and off != 0):
                remove_segment(name)
                raise ProtocolError(f"segment {name}: parts must start at 0, be non-empty, aligned and not overlap")
            end = off + nbytes
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise ProtocolError(f"shared-memory segment {name} does not exist") from None
        try:
            if os.fstat(fd).st_size != segment_class(end):
                raise ProtocolError(f"segment {name} holds {os.fstat(fd).st_size} bytes, the put declares {end}"
                                    f" (a segment is {segment_class(end)} bytes for that)")
            mm = mmap.mmap(fd, end, mmap.MAP_SHARED, mmap.PROT_READ)
        except BaseException:
            os.close(fd)
            remove_segment(name)
            raise
        os.close(fd)
        arrays = [np.frombuffer(mm, dtype=dtype, count=math.prod(shape), offset=off).reshape(shape)
                  for off, dtype, shape in parts]
        with self._lock:
            self._maps[mm] = (name, np.frombuffer(mm, np.uint8, count=1).ctypes.data, end)
        weakref.finalize(mm, _release, name, self.token, self.pool_limit)
        return arrays

    def receive_buffer(self, nbytes: int) -> np.ndarray | None:
        """A writable map of a new segment of this unit for ``nbytes`` received over a socket (a put from
        another host), so readers on this host can map what it stores; a recycled one when the free pool
        has one. The file's pages are reserved first (``posix_fallocate``): None when /dev/shm has no room
        for them, and the caller receives into its own memory instead. The map's last reference going
        releases the segment as an adopted one's does. The payload starts ``landing.OFFSET`` bytes into
        the segment (where the kernel copies a socket's bytes in fastest: ``tq/transport/landing.py``)."""
        size = segment_class(nbytes + landing.OFFSET)
        name = f"dtq-{self.token}-r{next(self._received):x}"
        path = _path(name)
        fd = _claim(self.token, size, path)
        try:
            if fd is None:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
                os.posix_fallocate(fd, 0, size)
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # no page faults in the receive
            mm = mmap.mmap(fd, nbytes + landing.OFFSET, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            if fd is not None:
                os.close(fd)
            remove_segment(name)
            return None
        os.close(fd)
        array = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=landing.OFFSET)
        with self._lock:
            self._maps[mm] = (name, array.ctypes.data - landing.OFFSET, nbytes)
        weakref.finalize(mm, _release, name, self.token, self.pool_limit)
        return array

    def pool_limit(self) -> int:
        """Free bytes the pool may hold now: its cap, and no more than the unit's budget leaves unheld."""
        if self.room is None:
            return self.pool_bytes
        return max(0, min(self.pool_bytes, self.room()))

    def locate(self, view: np.ndarray) -> tuple[str, int] | None:
        """``(segment name, byte offset)`` of a C-contiguous view of an adopted segment, else None."""
        obj: Any = view
        while isinstance(obj, np.ndarray):
            obj = obj.base
        if isinstance(obj, memoryview):
            obj = obj.obj
        if not isinstance(obj, mmap.mmap) or not view.flags.c_contiguous or view.nbytes == 0:
            return None
        with self._lock:
            entry = self._maps.get(obj)
        if entry is None:
            return None
        name, base, _ = entry
        return name, view.ctypes.data - base

    def stats(self) -> dict[str, int]:
        with self._lock:
            sizes = [n for _, _, n in self._maps.values()]
        return {"shm_segments": len(sizes), "shm_bytes": sum(sizes), "shm_free_segments": len(self.pool.names()),
                "shm_free_bytes": self.pool.free_bytes()}

    def close(self) -> None:
        shm_pool.drop_pool(SHM_DIR, self.token)
        remove_segments(self.token)
