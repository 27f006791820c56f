"""Turn scopes and retries: ``X-Turn-Id`` names one agent turn, which may hold several model calls.

Retries are safe both ways. A call is answered from the record (its reply returned, no engine
call, nothing recorded again) only when it is a *transport* retry: it carries an ``Idempotency-Key``
an earlier call of the session carried, or it is the OpenAI SDK's own retry of an identical body
(``x-stainless-retry-count`` > 0). The same request sent again under the same turn without those is
an agent asking again (after an unparsable reply, say): it generates again and is recorded as a
branch, as upstream Dressage does. :func:`turn_call_key` keys the identical-body case: turn id + a
hash of the request, without the fields that only shape delivery (``stream``, ``stream_options``),
so a retry that switches to streaming still replays, and without the ids a body may carry instead
of headers. :class:`CallScope` is what a call's headers say; :meth:`CallScope.key` its :class:`CallKey`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from dressage.errors import SessionIdError
from dressage.proxy.recording.turns import (HEADER_NAMES, MAX_ID_CHARS, CallIdentity, checked_identity,
                                           identity_from_headers)

__all__ = ["request_hash", "turn_call_key", "turn_of", "identity_of", "scope_of", "CallScope", "CallKey",
           "DELIVERY_FIELDS", "IDENTITY_FIELDS", "IDEMPOTENCY_HEADER", "SDK_RETRY_HEADER", "EXPECTED_VERSION_HEADER",
           "SANDBOX_HEADER"]

IDEMPOTENCY_HEADER = "idempotency-key"
SDK_RETRY_HEADER = "x-stainless-retry-count"
"""The OpenAI SDKs send it on every request: 0 on the first attempt, n on their n-th retry."""
SANDBOX_HEADER = "x-dressage-sandbox-id"
"""The sandbox a call's agent runs in, for tool-call hooks (:mod:`dressage.proxy.tool_call_hooks`)."""
EXPECTED_VERSION_HEADER = "x-dressage-expected-version"
"""Upstream's pin: the call must be served by this weight version (502 ``weight_version_mismatch``)."""

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
    """The turn id of a :func:`turn_call_key` (or of a :class:`CallKey`'s key; empty: no turn)."""
    return key.split("\x1f", 1)[0]


@dataclass(frozen=True, slots=True)
class CallKey:
    """How one call meets the record of earlier calls."""

    key: str | None = None
    """Its turn id (:func:`turn_of`) and what names the request: the idempotency key, or the body hash."""
    cached: bool = False
    """Its reply is kept under ``key``, for a transport retry to be answered from."""
    retry: bool = False
    """It is a transport retry: a reply kept under ``key`` answers it (a concurrent first attempt is awaited)."""
    request: str | None = None
    """For an ``Idempotency-Key``: the request's hash (:func:`request_hash`), which every use of the key
    must repeat; ``None`` when ``key`` names the request itself."""


@dataclass(frozen=True, slots=True)
class CallScope:
    """What a call's headers say beyond its session: its turn, its retry headers, the version it expects."""

    turn_id: str | None = None
    idempotency_key: str | None = None
    sdk_retry: int | None = None
    """``x-stainless-retry-count``; ``None`` when the client sent none."""
    expected_version: str | None = None
    sandbox_id: str | None = None
    """``X-Dressage-Sandbox-Id``: the sandbox upstream's tool-call hooks act on."""

    def key(self, body: Mapping[str, Any]) -> CallKey:
        turn = self.turn_id or ""
        if self.idempotency_key is not None:
            return CallKey(f"{turn}\x1fkey:{self.idempotency_key}", cached=True, retry=True,
                           request=request_hash(body))
        if self.sdk_retry is not None:  # an SDK that retries by itself: keep the reply for its retry
            return CallKey(turn_call_key(turn, body), cached=True, retry=self.sdk_retry > 0)
        if self.turn_id is not None:  # the turn is recorded; asking again generates again
            return CallKey(turn_call_key(turn, body))
        return CallKey()


def scope_of(headers: Mapping[str, str], body: Any = None) -> CallScope:
    """A call's :class:`CallScope` from its headers (the turn also from its body, see :func:`identity_of`).

    A malformed retry count counts as a first attempt; an idempotency key or expected version over
    the id limits is a 400 (:class:`~dressage.errors.SessionIdError`)."""
    turn = identity_of(headers, body).turn_id
    retry = headers.get(SDK_RETRY_HEADER)
    count = int(retry) if retry is not None and retry.strip().isdigit() else (0 if retry is not None else None)
    key, version = headers.get(IDEMPOTENCY_HEADER) or None, headers.get(EXPECTED_VERSION_HEADER) or None
    sandbox = headers.get(SANDBOX_HEADER) or None
    for name, value in (("Idempotency-Key", key), ("X-Dressage-Expected-Version", version),
                        ("X-Dressage-Sandbox-Id", sandbox)):
        if value is not None and (len(value) > MAX_ID_CHARS or not value.isprintable()):
            raise SessionIdError(f"{name}: at most {MAX_ID_CHARS} printable characters, got {len(value)}",
                                 param=name)
    return CallScope(turn, key, count, version, sandbox)


def identity_of(headers: Mapping[str, str], body: Any = None) -> CallIdentity:
    """A call's session, instance and turn: from its headers, else from its body's
    ``session_id`` / ``instance_id`` / ``turn_id`` (where upstream's clients put them too)."""
    ident = identity_from_headers(headers)  # the headers' ids are checked there, each named by its header
    where: list[str] = []

    def pick(header: str | None, name: str, header_name: str) -> str | None:
        if header:
            where.append(header_name)
            return header
        where.append(name)  # a refused body id is named by its field
        value = getattr(body, name, None)
        return None if value is None or value == "" else str(value)

    picked = CallIdentity(pick(ident.session_id, "session_id", HEADER_NAMES[0]),
                          pick(ident.instance_id, "instance_id", HEADER_NAMES[1]),
                          pick(ident.turn_id, "turn_id", HEADER_NAMES[2]))
    return checked_identity(picked, (where[0], where[1], where[2]))
