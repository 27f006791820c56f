"""Upstream-style session identification by headers, and turn-id idempotency.

``X-Session-Id`` (or ``X-SMG-Routing-Key``) names the session, ``X-Instance-Id`` its prompt
instance (the GRPO group) and ``X-Turn-Id`` one turn (a request sent again under it generates
again, a branch); a transport retry (``Idempotency-Key``, an SDK's ``x-stainless-retry-count``) gets the
recorded reply back and records nothing a second time. Header values are at most :data:`MAX_ID_CHARS` printable
characters, and a session id is also one path segment (:func:`path_safe`: it names the session in
``/sessions/{id}/...``); the turn cache keeps at most ``capacity`` settled turns (oldest forgotten first) and
instance groups need no table at all (:func:`instance_group` derives them from the id).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

from dressage.errors import IdempotencyKeyReusedError, SessionIdError

__all__ = ["CallIdentity", "identity_from_headers", "checked_identity", "path_safe", "TurnCache", "instance_group",
           "HEADER_NAMES"]

SESSION_HEADERS = ("x-session-id", "x-smg-routing-key")
MAX_ID_CHARS = 256


@dataclass(frozen=True, slots=True)
class CallIdentity:
    session_id: str | None = None
    instance_id: str | None = None
    turn_id: str | None = None


HEADER_NAMES = ("X-Session-Id", "X-Instance-Id", "X-Turn-Id")
"""Where each id of a :class:`CallIdentity` comes from, as an error's ``param`` names it."""
_HEADER_SPELLING = {"x-session-id": "X-Session-Id", "x-smg-routing-key": "X-SMG-Routing-Key"}


def identity_from_headers(headers: Mapping[str, str]) -> CallIdentity:
    """The identity a request's headers carry (header names are case-insensitive).

    Raises :class:`SessionIdError` (400, ``param`` the header) for a value over :data:`MAX_ID_CHARS`
    characters or with control characters, or a session id that is no path segment (:func:`path_safe`).
    """
    header = next((h for h in SESSION_HEADERS if headers.get(h)), None)
    sid = headers[header] if header is not None else None
    where = (_HEADER_SPELLING[header] if header is not None else HEADER_NAMES[0], *HEADER_NAMES[1:])
    return checked_identity(CallIdentity(sid, headers.get("x-instance-id") or None, headers.get("x-turn-id") or None),
                            where)


def path_safe(session_id: str) -> bool:
    """Whether ``session_id`` names its session in a URL path (``/sessions/{id}``) as it is named here.

    A ``/`` splits the segment (``%2F`` is decoded before routing, so even encoded it is two segments)
    and ``.`` / ``..`` are dot segments clients resolve away; any other printable character
    round-trips once percent-encoded (``?``, ``#``, ``%`` and spaces included).
    """
    return "/" not in session_id and session_id not in (".", "..")


def checked_identity(ident: CallIdentity, where: tuple[str, str, str] = HEADER_NAMES) -> CallIdentity:
    """``ident`` when each of its ids is at most :data:`MAX_ID_CHARS` printable characters and its
    session id is :func:`path_safe`; else :class:`SessionIdError` whose ``param`` is the ``where``
    entry of the id (the header, or the body field, it came from)."""
    for name, value, param in (("session id", ident.session_id, where[0]), ("instance id", ident.instance_id, where[1]),
                               ("turn id", ident.turn_id, where[2])):
        if value is not None and (len(value) > MAX_ID_CHARS or not value.isprintable()):
            raise SessionIdError(f"{name}: at most {MAX_ID_CHARS} printable characters, got {len(value)}", param=param)
    if ident.session_id is not None and not path_safe(ident.session_id):
        raise SessionIdError(f"session id: {ident.session_id!r} cannot name a session in a URL path "
                             "(/sessions/{id}): no '/', and not '.' or '..'", param=where[0])
    return ident


class TurnCache:
    """Replies of committed turns by (session, turn id); a turn in progress is awaited, not redone."""

    def __init__(self, capacity: int = 65_536) -> None:
        self.capacity = int(capacity)
        self._turns: OrderedDict[tuple[str, str], asyncio.Future] = OrderedDict()
        # Idempotency keys: the hash of the request each was first sent with (as many as turns are kept).
        self._requests: OrderedDict[tuple[str, str], str] = OrderedDict()

    def bind(self, session_id: str, key: str, request: str) -> None:
        """Tie an idempotency ``key`` to the ``request`` (hash) it first came with; the same key with another
        request is :class:`~dressage.errors.IdempotencyKeyReusedError`, before anything is replayed or run."""
        first = self._requests.setdefault((session_id, key), request)
        if first != request:
            raise IdempotencyKeyReusedError(
                "Idempotency-Key was sent before with another request in this session: a retry repeats its "
                "request (a new request needs a new key)")
        self._requests.move_to_end((session_id, key))
        if len(self._requests) > self.capacity:
            self._requests.popitem(last=False)

    def get(self, session_id: str, turn_id: str) -> asyncio.Future | None:
        return self._turns.get((session_id, turn_id))

    def begin(self, session_id: str, turn_id: str) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._turns[(session_id, turn_id)] = fut
        self._turns.move_to_end((session_id, turn_id))
        if len(self._turns) > self.capacity:
            self._evict()
        return fut

    def _evict(self) -> None:
        # Only settled turns go: a turn in flight has waiters that its commit must still answer.
        for key in [k for k, f in self._turns.items() if f.done()][:len(self._turns) - self.capacity]:
            del self._turns[key]

    def settle(self, session_id: str, turn_id: str, task: asyncio.Future) -> None:
        """Resolve the turn from ``task`` (the commit) whenever it ends, even if its caller is gone.

        A failed turn is forgotten so that its retry is a new call.
        """
        key = (session_id, turn_id)

        def done(t: asyncio.Future) -> None:
            fut = self._turns.get(key)
            if fut is None or fut.done():
                return
            if t.cancelled():
                self._turns.pop(key, None)
                fut.cancel()
            elif t.exception() is not None:
                self._turns.pop(key, None)
                fut.set_exception(t.exception())
                fut.exception()  # waiters, if any, re-raise it; nobody else has to look
            else:
                fut.set_result(t.result())

        task.add_done_callback(done)

    def abandon(self, session_id: str, turn_id: str, exc: BaseException | None = None) -> None:
        """The turn failed before its commit began: forget it and fail whoever waits on it."""
        fut = self._turns.pop((session_id, turn_id), None)
        if fut is not None and not fut.done():
            if isinstance(exc, Exception):
                fut.set_exception(exc)
                fut.exception()
            else:
                fut.cancel()

    def forget_session(self, session_id: str) -> None:
        for key in [k for k in self._turns if k[0] == session_id]:
            self._turns.pop(key, None)
        for key in [k for k in self._requests if k[0] == session_id]:
            del self._requests[key]

    def __len__(self) -> int:
        return len(self._turns)


def instance_group(instance_id: Any) -> int:
    """An integer prompt-group index for ``instance_id``: a number that fits 63 bits as itself, any
    other id as a negative index derived from its text (stable across restarts, no table to grow)."""
    text = str(instance_id)
    digits = text[1:] if text.startswith("-") else text
    if digits.isdigit() and digits.isascii() and len(digits) <= 18:
        return int(text)
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=7).digest()
    return -2 - int.from_bytes(digest, "big")  # negative: never collides with numbered groups
