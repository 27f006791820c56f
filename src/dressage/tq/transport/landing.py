"""Buffers a socket receives into: large ones start ``OFFSET`` bytes past a page boundary.

Where a receive buffer starts within its page decides how fast the kernel copies a socket's bytes into
it on this kind of host (AMD EPYC, measured with two processes moving 84 MB over loopback TCP and
nothing else changed): buffers that start at a page boundary, or 16 bytes past one (where glibc puts a
large ``malloc`` of its own ``mmap``, so every fresh numpy array of a MiB or more), took 70-110 ms;
buffers 64-2,048 bytes into their page took 38-48 ms. User-space copies do not care (a 5 MiB
``np.copyto`` ran at 37-40 GB/s at every pair of offsets). So a StorageUnit's blob buffers and a
client's receive pool come from :func:`landing`: a numpy allocation with a page of slack, viewed from
``OFFSET`` bytes past its first page boundary.

The view's base (``arr.base``) is the allocation that owns the memory, as for any numpy slice: a pool
keeps that owner, counts references to it to know when no view is left, and takes a view of it again
with :func:`landing_view`.
"""

from __future__ import annotations

import mmap

import numpy as np

__all__ = ["OFFSET", "MIN_BYTES", "landing", "landing_view", "owner_of"]

PAGE = mmap.PAGESIZE
OFFSET = 256
MIN_BYTES = 64 * 1024  # smaller buffers are plain allocations (a few pages: the copy is short anyway)


def landing_view(owner: np.ndarray, nbytes: int) -> np.ndarray:
    """The ``nbytes`` of ``owner`` (an allocation from :func:`landing`) that start ``OFFSET`` bytes past
    its first page boundary."""
    start = (OFFSET - owner.ctypes.data) % PAGE
    return owner[start:start + nbytes]


def landing(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes``: from ``MIN_BYTES`` up, starting ``OFFSET`` bytes past a page
    boundary (its ``base`` owns the memory, ``PAGE`` bytes more than asked for)."""
    if nbytes < MIN_BYTES:
        return np.empty(nbytes, dtype=np.uint8)
    return landing_view(np.empty(nbytes + PAGE, dtype=np.uint8), nbytes)


def owner_of(arr: np.ndarray) -> np.ndarray:
    """The array owning ``arr``'s memory (``arr`` itself when it owns it)."""
    return arr if arr.base is None else arr.base  # type: ignore[return-value]
