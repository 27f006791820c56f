"""Giving freed heap pages back to the OS at batch boundaries.

glibc keeps the pages of freed chunks mapped in its arenas (the main heap and one per thread that
allocated under contention) until a trim; a serving process whose sessions came and went then holds
their memory as free heap. :func:`trim_heap` returns those pages (``malloc_trim(0)``: every arena,
a fraction of a millisecond to a few). Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import time

__all__ = ["trim_heap"]

_trim = None
_loaded = False


def _malloc_trim():
    global _trim, _loaded
    if not _loaded:
        _loaded = True
        try:
            fn = ctypes.CDLL("libc.so.6").malloc_trim
            fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
            _trim = fn
        except (OSError, AttributeError):  # not glibc
            _trim = None
    return _trim


def trim_heap() -> float:
    """Hand the free pages of every malloc arena back to the OS; returns the seconds it took (0 where
    there is no ``malloc_trim``)."""
    fn = _malloc_trim()
    if fn is None:
        return 0.0
    t0 = time.perf_counter()
    fn(0)
    return time.perf_counter() - t0
