"""Turn scopes: ``X-Turn-Id`` names one agent turn, which may hold several model calls.

A call is replayed (its recorded reply returned, nothing recorded again) only when the same
turn sends the *same* request again; the same turn id with a different body is the turn's next
call. :func:`turn_call_key` is the key of that idempotency: turn id + a hash of the request,
without the fields that only shape delivery (``stream``, ``stream_options``), so a retry that
switches to streaming still replays, and without the ids a body may carry instead of headers.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from dressage.proxy.recording.turns import CallIdentity, checked_identity, identity_from_headers

__all__ = ["request_hash", "turn_call_key", "turn_of", "identity_of", "DELIVERY_FIELDS", "IDENTITY_FIELDS"]

DELIVERY_FIELDS = frozenset({"stream", "stream_options"})
IDENTITY_FIELDS = frozenset({"session_id", "instance_id", "turn_id"})
"""Body fields that name the call (as upstream's clients may send them) rather than ask something."""


def request_hash(body: Mapping[str, Any]) -> str:
    """A stable hash of a request body (keys sorted, delivery-only fields left out)."""
    canonical = {k: v for k, v in body.items()
                 if k not in DELIVERY_FIELDS and k not in IDENTITY_FIELDS and v is not None}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=12).hexdigest()


def turn_call_key(turn_id: str, body: Mapping[str, Any]) -> str:
    """The replay key of one call inside turn ``turn_id``."""
    return f"{turn_id}\x1f{request_hash(body)}"


def turn_of(key: str) -> str:
    """The turn id of a :func:`turn_call_key`."""
    return key.split("\x1f", 1)[0]


def identity_of(headers: Mapping[str, str], body: Any = None) -> CallIdentity:
    """A call's session, instance and turn: from its headers, else from its body's
    ``session_id`` / ``instance_id`` / ``turn_id`` (where upstream's clients put them too)."""
    ident = identity_from_headers(headers)

    def pick(header: str | None, name: str) -> str | None:
        if header:
            return header
        value = getattr(body, name, None)
        return None if value is None or value == "" else str(value)

    return checked_identity(CallIdentity(pick(ident.session_id, "session_id"), pick(ident.instance_id, "instance_id"),
                                         pick(ident.turn_id, "turn_id")))
