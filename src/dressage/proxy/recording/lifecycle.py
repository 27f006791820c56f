"""In-flight calls: every model call of a session is counted while it runs, its recording included.

Finalize (:class:`dressage.proxy.upstream.trajectories.Trajectories`) waits (bounded) until the
session has none, so an agent's last call is recorded before its trajectory is cut. A call's
recording, once begun, runs whole (:class:`CallInFlight`), whoever stops waiting for it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, TypeVar

__all__ = ["InFlight", "CallInFlight"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class InFlight:
    """Running model calls per session (all methods but :meth:`idle` on the server's loop)."""

    def __init__(self) -> None:
        self._running: dict[str, int] = {}
        self._idle: dict[str, asyncio.Event] = {}

    def call(self, session_id: str) -> "CallInFlight":
        """One model call of the session, counted from ``with`` until it is over (:class:`CallInFlight`)."""
        return CallInFlight(self, session_id)

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


class CallInFlight:
    """One model call, counted in flight from ``with`` until it is over: until the block ends, or, once
    its recording began (:meth:`commit`), until that recording is done.

    The recording runs as a task of its own, awaited shielded: a call cancelled while it records (the
    agent hung up, :mod:`dressage.proxy.http.hangup`; the server stopping) leaves its steps recorded
    whole, the session's bookkeeping with them, or not at all; never half of it. Every endpoint's call
    (chat and the endpoints on its path, ``/generate``, text completions) records through here.
    """

    __slots__ = ("in_flight", "session_id", "recording")

    def __init__(self, in_flight: InFlight, session_id: str) -> None:
        self.in_flight, self.session_id = in_flight, session_id
        self.recording: asyncio.Future[Any] | None = None
        """The task recording the call, once it began (``None`` before: nothing of the call is recorded)."""

    def __enter__(self) -> "CallInFlight":
        self.in_flight.enter(self.session_id)
        return self

    def __exit__(self, *exc: object) -> None:
        task = self.recording
        if task is None or task.done():
            self.in_flight.exit(self.session_id)
        else:  # the caller stopped waiting (cancelled): the call is over when its recording is
            task.add_done_callback(self._recorded_late)

    def _recorded_late(self, task: asyncio.Future[Any]) -> None:
        self.in_flight.exit(self.session_id)
        if not task.cancelled() and task.exception() is not None:  # no one else is left to read it
            log.warning("session %s: a call whose agent left was not recorded: %s", self.session_id,
                        task.exception())

    def commit(self, recording: Awaitable[T]) -> "asyncio.Future[T]":
        """Begin the call's recording (``recording``: its steps' commit); await what this returns (its value,
        or its error). The task is :attr:`recording` as soon as this returns."""
        self.recording = asyncio.ensure_future(recording)
        return asyncio.shield(self.recording)
