"""Turn scopes: ``X-Turn-Id`` names one agent turn, which may hold several model calls.

A call is replayed (its recorded reply returned, nothing recorded again) only when the same
turn sends the *same* request again; the same turn id with a different body is the turn's next
call. :func:`turn_call_key` is the key of that idempotency: turn id + a hash of the request,
without the fields that only shape delivery (``stream``, ``stream_options``), so a retry that
switches to streaming still replays.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

__all__ = ["request_hash", "turn_call_key", "turn_of", "DELIVERY_FIELDS"]

DELIVERY_FIELDS = frozenset({"stream", "stream_options"})


def request_hash(body: Mapping[str, Any]) -> str:
    """A stable hash of a request body (keys sorted, delivery-only fields left out)."""
    canonical = {k: v for k, v in body.items() if k not in DELIVERY_FIELDS and v is not None}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=12).hexdigest()


def turn_call_key(turn_id: str, body: Mapping[str, Any]) -> str:
    """The replay key of one call inside turn ``turn_id``."""
    return f"{turn_id}\x1f{request_hash(body)}"


def turn_of(key: str) -> str:
    """The turn id of a :func:`turn_call_key`."""
    return key.split("\x1f", 1)[0]
