"""The free pool of one unit's recycled /dev/shm segments, indexed by a one-page file every process maps.

The index ``dtq-<token>-zi`` holds, per size class (a power of two), a bitmap of ``SLOTS`` slots; slot
``s`` of class ``c`` is the file ``dtq-<token>-z<c>s<s>``. Claiming (a writer, any process) and releasing
(the unit) lock the index (``flock``, plus a thread lock, as ``flock`` does not exclude threads sharing a
descriptor), flip a bit and rename one file while holding the lock, so the bitmap and the files agree
and no call lists /dev/shm: a claim or a release costs the same however many files it holds. A process
that dies inside the lock leaves at worst a set bit without a file (the next claim of it clears the bit)
or a file without a bit (the next release into that slot replaces it); the unit's close removes every
file of its token.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["SLOTS", "FreePool", "pwrite_all", "pool_for", "create_pool", "drop_pool", "index_name",
           "slot_name"]

SLOTS = 128                     # free segments a unit keeps per size class
_WORDS = SLOTS // 64
_MIN_BIT, _MAX_BIT = 12, 47     # classes from 4 KiB (a page) to 128 TiB
_CLASSES = _MAX_BIT - _MIN_BIT + 1
_MAGIC = b"DTQPOOL1"
_HEADER = 16
_TABLE = struct.Struct(f"<{_CLASSES * _WORDS}Q")
_WORD = struct.Struct("<Q")
_SIZE = mmap.PAGESIZE if mmap.PAGESIZE >= _HEADER + _TABLE.size else _HEADER + _TABLE.size


def index_name(token: str) -> str:
    return f"dtq-{token}-zi"


def slot_name(token: str, bit: int, slot: int) -> str:
    return f"dtq-{token}-z{bit}s{slot}"


class FreePool:
    """One unit's free-segment index, mapped by this process."""

    def __init__(self, directory: str, token: str, fd: int) -> None:
        self.directory = directory
        self.token = token
        self._fd = fd
        self.inode = os.fstat(fd).st_ino
        self._mm = mmap.mmap(fd, _SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._thread_lock = threading.Lock()
        self._closed = False
        self.checked = time.monotonic()  # when ``pool_for`` last saw this index under its name

    def _slot_path(self, bit: int, slot: int) -> str:
        return os.path.join(self.directory, slot_name(self.token, bit, slot))

    @contextmanager
    def _locked(self) -> Iterator[bool]:
        """Yields False (and locks nothing) once closed: the callers then claim and release nothing."""
        with self._thread_lock:
            if self._closed:
                yield False
                return
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield True
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _word_at(self, bit: int, word: int) -> int:
        return _HEADER + ((bit - _MIN_BIT) * _WORDS + word) * 8

    def _flip(self, bit: int, slot: int, on: bool) -> None:
        at = self._word_at(bit, slot // 64)
        (w,) = _WORD.unpack_from(self._mm, at)
        mask = 1 << (slot % 64)
        _WORD.pack_into(self._mm, at, (w | mask) if on else (w & ~mask))

    def claim(self, size: int, path: str) -> bool:
        """Rename a free segment of ``size``'s class to ``path``; False when the class has none."""
        bit = size.bit_length() - 1
        if not _MIN_BIT <= bit <= _MAX_BIT:
            return False
        with self._locked() as usable:
            for word in range(_WORDS if usable else 0):
                (w,) = _WORD.unpack_from(self._mm, self._word_at(bit, word))
                while w:
                    low = (w & -w).bit_length() - 1
                    w &= w - 1
                    slot = word * 64 + low
                    self._flip(bit, slot, False)
                    try:
                        os.rename(self._slot_path(bit, slot), path)
                    except FileNotFoundError:  # a claimer died between its rename and its bit: stale
                        continue
                    return True
        return False

    def release(self, path: str, size: int, pool_bytes: int) -> bool:
        """Rename ``path`` (a file of ``size`` bytes, a class) into a free slot; False when the pool is
        full (the caller unlinks it then)."""
        bit = size.bit_length() - 1
        if not _MIN_BIT <= bit <= _MAX_BIT:
            return False
        with self._locked() as usable:
            if not usable or self._free_bytes() + size > pool_bytes:
                return False
            for word in range(_WORDS):
                (w,) = _WORD.unpack_from(self._mm, self._word_at(bit, word))
                free = ~w & ((1 << 64) - 1)
                if free:
                    slot = word * 64 + (free & -free).bit_length() - 1
                    os.rename(path, self._slot_path(bit, slot))  # replaces a file a dead releaser left
                    self._flip(bit, slot, True)
                    return True
        return False

    def _free_bytes(self) -> int:
        words = _TABLE.unpack_from(self._mm, _HEADER)
        return sum(w.bit_count() << (_MIN_BIT + i // _WORDS) for i, w in enumerate(words) if w)

    def names(self) -> list[str]:
        """The free segments' names, as the index records them."""
        with self._locked() as usable:
            words = _TABLE.unpack_from(self._mm, _HEADER) if usable else ()
        out = []
        for i, w in enumerate(words):
            bit, base = _MIN_BIT + i // _WORDS, (i % _WORDS) * 64
            out.extend(slot_name(self.token, bit, base + s) for s in range(64) if w >> s & 1)
        return sorted(out)

    def free_bytes(self) -> int:
        with self._locked() as usable:
            return self._free_bytes() if usable else 0

    def close(self) -> None:
        with self._thread_lock:
            if not self._closed:
                self._closed = True
                self._mm.close()
                os.close(self._fd)


_RECHECK_S = 1.0
_pools: dict[tuple[str, str], FreePool] = {}
_pools_lock = threading.Lock()


def create_pool(directory: str, token: str) -> FreePool:
    """The unit's side: a new, empty index for ``token`` (an old one of the same token is emptied)."""
    path = os.path.join(directory, index_name(token))
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, 0)
        os.ftruncate(fd, _SIZE)
        os.pwrite(fd, _MAGIC, 0)
        pool = FreePool(directory, token, fd)
    except BaseException:
        os.close(fd)
        raise
    with _pools_lock:
        old = _pools.pop((directory, token), None)
        _pools[(directory, token)] = pool
    if old is not None:
        old.close()
    return pool


def pool_for(directory: str, token: str) -> FreePool | None:
    """This process's mapping of ``token``'s index (opened once; looked up again at most every
    ``_RECHECK_S``, and reopened if the unit made a new one); None when the unit has none (closed, or
    never offered shared memory). A stale mapping only finds no files to claim."""
    path = os.path.join(directory, index_name(token))
    key = (directory, token)
    now = time.monotonic()
    with _pools_lock:
        pool = _pools.get(key)
        if pool is not None and now - pool.checked < _RECHECK_S:
            return pool
        try:
            inode = os.stat(path).st_ino
        except FileNotFoundError:
            inode = None
        if pool is not None and pool.inode == inode:
            pool.checked = now
            return pool
        if pool is not None:
            del _pools[key]
            pool.close()
        if inode is None:
            return None
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        try:
            if os.fstat(fd).st_size != _SIZE or os.pread(fd, len(_MAGIC), 0) != _MAGIC:
                os.close(fd)
                return None
            pool = _pools[key] = FreePool(directory, token, fd)
        except BaseException:
            os.close(fd)
            raise
        return pool


def drop_pool(directory: str, token: str) -> None:
    """Forget (and unmap) this process's mapping of ``token``'s index."""
    with _pools_lock:
        pool = _pools.pop((directory, token), None)
    if pool is not None:
        pool.close()


def pwrite_all(fd: int, view: memoryview, offset: int = 0) -> None:
    """Write all of ``view`` at ``offset`` of ``fd`` (``pwrite`` may write less than asked)."""
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
