"""Shared-memory fast path between processes on one host: payloads as files in /dev/shm.

A writer on the unit's host writes the array into ``/dev/shm/dtq-<unit token>-<n>`` and sends only the
name; the unit maps the file and keeps that mapping as the stored blob (no copy). A reader on the same host
gets ``(name, offset)`` back and maps the rows read-only (no copy, no socket transfer). A file is unlinked
when the unit drops its last view of the blob; readers' mappings stay valid after that. Only names with the
unit's own prefix are ever opened.
"""

from __future__ import annotations

import glob
import math
import mmap
import os
import re
import secrets
import socket
import threading
import weakref
from typing import Any

import numpy as np

from dressage.errors import KeyNotFoundError, ProtocolError

__all__ = ["SHM_DIR", "SHM_MIN_BYTES", "host_id", "new_token", "write_segment", "map_segment", "ShmRegistry",
           "remove_segment", "remove_segments"]

SHM_DIR = "/dev/shm"
# Below this a socket frame is cheaper than creating, mapping and unlinking a file.
SHM_MIN_BYTES = 256 * 1024
_NAME = re.compile(r"^dtq-[0-9a-f]{16}-[0-9a-z]+$")
_PAGE = mmap.PAGESIZE


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


def write_segment(name: str, array: np.ndarray) -> None:
    """Create the segment and write the array's bytes (OSError if /dev/shm is full: fall back to frames)."""
    path = _path(name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(array.reshape(-1).view(np.uint8))
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], done)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        raise
    os.close(fd)


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
    """Read-only array over ``shape`` elements at byte ``offset`` of a segment (the reader's side)."""
    nbytes = dtype.itemsize * math.prod(shape)
    start = (offset // _PAGE) * _PAGE
    try:
        fd = os.open(_path(name), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise KeyNotFoundError(f"shared-memory segment {name} is gone (its key was deleted)") from None
    try:
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # fault the pages in at once
        mm = mmap.mmap(fd, offset - start + nbytes, flags, mmap.PROT_READ, offset=start)
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=dtype, count=math.prod(shape), offset=offset - start).reshape(shape)


class ShmRegistry:
    """The unit's side: adopts segments as stored arrays and finds the segment behind a stored view."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token or new_token()
        self._maps: "weakref.WeakKeyDictionary[mmap.mmap, tuple[str, int, int]]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def owns(self, name: str) -> bool:
        return isinstance(name, str) and name.startswith(f"dtq-{self.token}-")

    def adopt(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """Map a writer's segment as a read-only array; the file is unlinked once the array is garbage."""
        if not self.owns(name):
            raise ProtocolError(f"segment {name!r:.80} does not belong to this unit")
        path = _path(name)
        nbytes = dtype.itemsize * math.prod(shape)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise ProtocolError(f"shared-memory segment {name} does not exist") from None
        try:
            if os.fstat(fd).st_size != nbytes or nbytes == 0:
                raise ProtocolError(f"segment {name} holds {os.fstat(fd).st_size} bytes, the put declares {nbytes}")
            mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
        except BaseException:
            os.close(fd)
            remove_segment(name)
            raise
        os.close(fd)
        array = np.frombuffer(mm, dtype=dtype).reshape(shape)
        with self._lock:
            self._maps[mm] = (name, array.ctypes.data, nbytes)
        weakref.finalize(mm, remove_segment, name)
        return array

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
        return {"shm_segments": len(sizes), "shm_bytes": sum(sizes)}

    def close(self) -> None:
        remove_segments(self.token)
