"""Bounded live sessions: idle eviction (``--session-timeout``) and a cap (``--max-sessions``).

:class:`SessionKeeper` tracks when each active session was last used (a call began or recorded);
``busy(session_id)`` says how many of its calls are in flight. An active session idle for ``timeout_s`` with nothing in
flight is aborted (its TQ keys released, the journal told) and forgotten. Before a new session is
admitted the keeper sweeps (at most once a second, or at once when at the cap); if the cap is
still reached the new session is refused with :class:`SessionLimitError` (429). Sessions that
were finalized or aborted elsewhere drop out of the count as the keeper meets them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Callable

from dressage.errors import DressageError, SessionLimitError

__all__ = ["SessionKeeper"]


class SessionKeeper:
    """Idle eviction and the live-session cap over ``core.sessions``.

    ``busy(session_id)``: calls in flight (such a session is never evicted); ``on_evict(session_id)``
    cleans what the service keeps per session; ``clock`` is injectable.
    """

    def __init__(self, core: Any, *, timeout_s: float, max_sessions: int,
                 busy: Callable[[str], int] | None = None, on_evict: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.core, self.timeout_s, self.max_sessions = core, float(timeout_s), int(max_sessions)
        self.busy = busy or (lambda sid: 0)
        self.on_evict, self.clock = on_evict, clock
        self._last: OrderedDict[str, float] = OrderedDict()
        self._swept = float("-inf")
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._last)

    def touch(self, session_id: str) -> None:
        self._last[session_id] = self.clock()
        self._last.move_to_end(session_id)

    def adopt(self) -> None:
        """Track every active session of the core (those a journal replay brought back)."""
        for sid, s in list(self.core.sessions.items()):
            if s.state == "active" and sid not in self._last:
                self.touch(sid)

    def release(self, session_id: str) -> None:
        self._last.pop(session_id, None)

    def admit(self) -> None:
        """Make room for one new session, or raise :class:`SessionLimitError`."""
        now = self.clock()
        full = len(self._last) >= self.max_sessions
        if full or now - self._swept >= 1.0:
            self.sweep(now, prune=full)
        if len(self._last) >= self.max_sessions:
            idle = (f"idle ones are evicted after {self.timeout_s:g} s" if self.timeout_s
                    else "idle ones are never evicted: --session-timeout 0")
            raise SessionLimitError(f"the Proxy holds its maximum of {self.max_sessions} live sessions; finalize "
                                    f"or abort some ({idle})")

    def sweep(self, now: float | None = None, *, prune: bool = False) -> list[str]:
        """Evict idle sessions (oldest first); ``prune`` also drops sessions that are no longer active."""
        now = self.clock() if now is None else now
        self._swept = now
        if prune:
            for sid in [sid for sid in self._last if not self._active(sid)]:
                self.release(sid)
        evicted: list[str] = []
        if self.timeout_s <= 0:
            return evicted
        for sid, last in list(self._last.items()):
            if now - last < self.timeout_s:
                break  # ordered by last use: the rest are younger
            if self.busy(sid):
                continue  # a call in flight: its end is the next use
            self.release(sid)
            if self._active(sid):
                try:
                    self.core.abort(sid, f"idle for over {self.timeout_s:g} s")
                except DressageError:
                    continue  # finalized or aborted meanwhile
                self.evicted += 1
                evicted.append(sid)
                if self.on_evict is not None:
                    self.on_evict(sid)
        return evicted

    def _active(self, session_id: str) -> bool:
        s = self.core.sessions.get(session_id)
        return s is not None and s.state == "active"
