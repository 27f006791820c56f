"""JSON on the Proxy's hot paths: orjson where it gives the same value, the stdlib where it would not.

The engine's ``/generate`` answer (megabytes of base64 R3 and long logprob lists) and the chat
replies are the largest JSON the Proxy handles per call. ``orjson`` parses and writes them several
times faster; a document it refuses (``NaN``, integers beyond 64 bits, lone surrogates) goes through
the stdlib instead, so every value and every typed error stays what it was.
"""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - a declared dependency; the stdlib keeps working without it
    orjson = None

__all__ = ["loads", "dumps"]


def loads(data: bytes | str) -> Any:
    """Parse ``data``; raises ``ValueError`` when it is not JSON (the stdlib's verdict)."""
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # NaN, huge integers, ...: the stdlib accepts or refuses as before
    return json.loads(data)


def dumps(value: Any) -> bytes:
    """``value`` as UTF-8 JSON bytes (the stdlib's text for what orjson cannot write)."""
    if orjson is not None:
        try:
            return orjson.dumps(value)
        except (orjson.JSONEncodeError, TypeError):
            pass
    return json.dumps(value).encode("utf-8")
