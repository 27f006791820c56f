"""Upstream-style session identification by headers, and turn-id idempotency.

``X-Session-Id`` (or ``X-SMG-Routing-Key``) names the session, ``X-Instance-Id`` its prompt
instance (the GRPO group) and ``X-Turn-Id`` one turn: a retried turn gets the recorded reply
back and records nothing a second time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["CallIdentity", "identity_from_headers", "TurnCache", "instance_group"]

SESSION_HEADERS = ("x-session-id", "x-smg-routing-key")


@dataclass(frozen=True, slots=True)
class CallIdentity:
    session_id: str | None = None
    instance_id: str | None = None
    turn_id: str | None = None


def identity_from_headers(headers: Mapping[str, str]) -> CallIdentity:
    """The identity a request's headers carry (header names are case-insensitive)."""
    sid = next((headers[h] for h in SESSION_HEADERS if headers.get(h)), None)
    return CallIdentity(sid, headers.get("x-instance-id") or None, headers.get("x-turn-id") or None)


class TurnCache:
    """Replies of committed turns by (session, turn id); a turn in progress is awaited, not redone."""

    def __init__(self) -> None:
        self._turns: dict[tuple[str, str], asyncio.Future] = {}

    def get(self, session_id: str, turn_id: str) -> asyncio.Future | None:
        return self._turns.get((session_id, turn_id))

    def begin(self, session_id: str, turn_id: str) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._turns[(session_id, turn_id)] = fut
        return fut

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

    def __len__(self) -> int:
        return len(self._turns)


def instance_group(instance_id: Any, groups: dict[str, int]) -> int:
    """An integer prompt-group index for ``instance_id`` (numbers as themselves, others by first use)."""
    text = str(instance_id)
    if text.lstrip("-").isdigit():
        return int(text)
    return groups.setdefault(text, -2 - len(groups))  # negative: never collides with numbered groups
