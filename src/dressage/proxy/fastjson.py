"""JSON for the Proxy's hot paths: orjson where it gives the same value, the stdlib otherwise.

``loads`` takes ``bytes`` or ``str`` and falls back to :func:`json.loads` for what orjson refuses
but the stdlib reads (``NaN`` / ``Infinity`` literals), so a caller sees the values and errors it
saw before, only sooner; one difference: an integer beyond 64 bits comes back as a float (the wire
checks refuse it as not an integer, as they refused the out-of-range int before). ``dumps`` returns
UTF-8 bytes; it falls back to :func:`json.dumps` for values orjson cannot write (lone surrogates,
integers beyond 64 bits).
"""

from __future__ import annotations

import json
from typing import Any

try:  # orjson is a dependency of the ``server`` extra; the stdlib keeps the Proxy working without it
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only where orjson is missing
    _orjson = None  # type: ignore[assignment]

__all__ = ["loads", "dumps"]


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse one JSON document; raises ``ValueError`` (``json.JSONDecodeError``) when it is not JSON."""
    if _orjson is not None:
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass  # the stdlib decides: it reads a few things orjson refuses, and words the error
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    return json.loads(data)


def dumps(value: Any, *, numpy: bool = False) -> bytes:
    """``value`` as compact JSON, UTF-8 encoded. ``numpy``: integer arrays are written as lists of
    their values (orjson reads them natively: no Python list of ints is made)."""
    if _orjson is not None:
        try:
            return _orjson.dumps(value, option=_NUMPY_OPTIONS if numpy else _orjson.OPT_NON_STR_KEYS)
        except (TypeError, _orjson.JSONEncodeError):
            pass
    return json.dumps(value, separators=(",", ":"), default=_numpy_default if numpy else None).encode("utf-8")


def _numpy_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        return value.tolist()
    if isinstance(value, np.integer):
        return int(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_NUMPY_OPTIONS = None if _orjson is None else _orjson.OPT_NON_STR_KEYS | _orjson.OPT_SERIALIZE_NUMPY
