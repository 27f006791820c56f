"""Session lifecycle use cases behind ``/session/finalize`` and ``/session/discard``.

- **In-flight calls**: every model call of a session is counted while it runs; finalize waits
  (bounded) until the session has none, so an agent's last call is recorded before its
  trajectory is cut.
- **Idempotent finalize**: the answer of a finalize is kept; a repeat (a client retry) gets the
  same answer without finalizing twice, also after the session was read and drained.
- **Turns**: a session's steps and its agent turns (``X-Turn-Id`` scopes) are counted apart.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, Iterable

__all__ = ["InFlight", "FinalizeLedger", "count_turns"]


class InFlight:
    """Running model calls per session (all methods on the server's loop)."""

    def __init__(self) -> None:
        self._running: dict[str, int] = {}
        self._idle: dict[str, asyncio.Event] = {}

    def enter(self, session_id: str) -> None:
        self._running[session_id] = self._running.get(session_id, 0) + 1
        ev = self._idle.get(session_id)
        if ev is not None:
            ev.clear()

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


class FinalizeLedger:
    """Finalize answers by session id, the newest ``capacity`` kept (a repeat is answered from here)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = int(capacity)
        self._answers: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def get(self, session_id: str) -> dict[str, Any] | None:
        return self._answers.get(session_id)

    def put(self, session_id: str, answer: dict[str, Any]) -> None:
        self._answers[session_id] = answer
        self._answers.move_to_end(session_id)
        while len(self._answers) > self.capacity:
            self._answers.popitem(last=False)

    def drop(self, session_id: str) -> None:
        self._answers.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._answers)


def count_turns(steps: Iterable[Any]) -> int:
    """Agent turns among ``steps``: distinct ``turn_id`` scopes; a step without one is its own turn."""
    turns: set[str] = set()
    loose = 0
    for st in steps:
        meta = getattr(st, "metadata", None) or {}
        tid = meta.get("turn_id")
        if tid is None:
            loose += 1
        else:
            turns.add(str(tid))
    return len(turns) + loose
