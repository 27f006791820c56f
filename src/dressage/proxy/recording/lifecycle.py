"""In-flight calls: every model call of a session is counted while it runs.

Finalize (:class:`dressage.proxy.upstream.trajectories.Trajectories`) waits (bounded) until the
session has none, so an agent's last call is recorded before its trajectory is cut.
"""

from __future__ import annotations

import asyncio

__all__ = ["InFlight"]


class InFlight:
    """Running model calls per session (all methods but :meth:`idle` on the server's loop)."""

    def __init__(self) -> None:
        self._running: dict[str, int] = {}
        self._idle: dict[str, asyncio.Event] = {}

    def enter(self, session_id: str) -> None:
        self._running[session_id] = self._running.get(session_id, 0) + 1
        ev = self._idle.get(session_id)
        if ev is not None:
            ev.clear()

    def total(self) -> int:
        """Calls in flight, every session."""
        return sum(self._running.values())

    def idle(self) -> bool:
        """No call in flight (one truth test of a dict: safe to ask from another thread)."""
        return not self._running

    def exit(self, session_id: str) -> None:
        n = self._running.get(session_id, 0) - 1
        if n > 0:
            self._running[session_id] = n
            return
        self._running.pop(session_id, None)
        ev = self._idle.pop(session_id, None)
        if ev is not None:
            ev.set()

    def running(self, session_id: str) -> int:
        return self._running.get(session_id, 0)

    def waiting(self, session_id: str) -> bool:
        """Whether someone (a finalize) waits for the session's calls to end."""
        return session_id in self._idle

    async def wait_idle(self, session_id: str, timeout_s: float) -> bool:
        """True once the session has no call running; False when ``timeout_s`` passed first."""
        if not self._running.get(session_id):
            return True
        ev = self._idle.setdefault(session_id, asyncio.Event())
        try:
            await asyncio.wait_for(ev.wait(), timeout_s)
        except asyncio.TimeoutError:
            return not self._running.get(session_id)
        return True

    def __len__(self) -> int:
        return sum(self._running.values())
