"""Several engines behind one Proxy: sticky sessions by consistent hashing, health checks, failover.

A session keeps the engine it first hashed to, so the engine's prefix cache serves every turn.
An engine that fails its health check leaves the ring; its sessions move to the next engine on
the ring at their next call, and the move is reported so the caller can record the boundary.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from dressage.errors import NoHealthyEngineError

__all__ = ["EnginePool", "EngineMember", "Placement"]


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


@dataclass(slots=True)
class EngineMember:
    """One engine: its client and what the health checks learnt about it."""

    url: str
    client: Any
    healthy: bool = True
    failures: int = 0
    last_check: float | None = None
    calls: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a session's next call goes; ``moved_from`` is set when its engine was taken out."""

    member: EngineMember
    moved_from: str | None = None


@dataclass(slots=True)
class _Move:
    session_id: str
    from_url: str
    to_url: str
    at: float = field(default_factory=time.time)


class EnginePool:
    """Engines keyed by URL on a hash ring of ``vnodes`` points each.

    ``failures_to_remove`` consecutive failed checks take an engine out; one passing check
    brings it back (sessions already moved stay where they are).
    """

    def __init__(self, clients: Sequence[Any], *, vnodes: int = 64, failures_to_remove: int = 1,
                 check_timeout_s: float = 2.0) -> None:
        if not clients:
            raise ValueError("an engine pool needs at least one engine")
        self.members: dict[str, EngineMember] = {}
        for c in clients:
            url = str(getattr(c, "base_url", f"engine-{len(self.members)}"))
            if url in self.members:
                raise ValueError(f"engine {url} is listed twice")
            self.members[url] = EngineMember(url, c)
        self.failures_to_remove = int(failures_to_remove)
        self.check_timeout_s = float(check_timeout_s)
        ring = sorted((_hash(f"{url}#{i}"), url) for url in self.members for i in range(int(vnodes)))
        self._points = [p for p, _ in ring]
        self._owners = [u for _, u in ring]
        self._sticky: dict[str, str] = {}
        self._unsettled: dict[str, str] = {}
        self.moves: list[_Move] = []
        self._monitor: asyncio.Task | None = None

    # ---------------------------------------------------------------- placement
    def _ring_owner(self, session_id: str) -> str:
        start = bisect.bisect(self._points, _hash(session_id))
        n = len(self._points)
        for k in range(n):
            url = self._owners[(start + k) % n]
            if self.members[url].healthy:
                return url
        raise NoHealthyEngineError(f"no healthy engine among {', '.join(self.members)}")

    def place(self, session_id: str) -> Placement:
        """The engine for the session's next call (sticky; moved if its engine is out).

        ``moved_from`` stays set until :meth:`settle`: a call that fails after the move must not
        hide it from the retry.
        """
        current = self._sticky.get(session_id)
        if current is not None and self.members[current].healthy:
            return Placement(self.members[current], moved_from=self._unsettled.get(session_id))
        url = self._ring_owner(session_id)
        self._sticky[session_id] = url
        if current is None:
            return Placement(self.members[url])
        self.moves.append(_Move(session_id, current, url))
        self._unsettled.setdefault(session_id, current)
        return Placement(self.members[url], moved_from=self._unsettled[session_id])

    def settle(self, session_id: str) -> None:
        """A step of the session was recorded on its current engine (the move, if any, with it)."""
        self._unsettled.pop(session_id, None)

    def engine_of(self, session_id: str) -> str | None:
        return self._sticky.get(session_id)

    def forget(self, session_id: str) -> None:
        self._sticky.pop(session_id, None)
        self._unsettled.pop(session_id, None)

    @property
    def single(self) -> bool:
        return len(self.members) == 1

    # ------------------------------------------------------------------ health
    async def check(self) -> list[str]:
        """Probe every engine's ``/health`` once; returns the URLs taken out by this round."""
        members = list(self.members.values())
        results = await asyncio.gather(*(m.client.health(timeout=self.check_timeout_s) for m in members),
                                       return_exceptions=True)
        removed = []
        for m, ok in zip(members, results):
            m.last_check = time.time()
            if ok is True:
                m.failures, m.healthy = 0, True
                continue
            m.failures += 1
            if m.healthy and m.failures >= self.failures_to_remove:
                m.healthy = False
                removed.append(m.url)
        return removed

    def ensure_monitor(self, interval_s: float) -> None:
        """Start the periodic health check on the running loop (once; no-op with one engine)."""
        if interval_s <= 0 or self.single or (self._monitor is not None and not self._monitor.done()):
            return
        self._monitor = asyncio.get_running_loop().create_task(self._watch(interval_s))

    async def _watch(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.check()

    async def close(self, *, clients: bool = True) -> None:
        """Stop the health checks; with ``clients``, close each member's client too."""
        if self._monitor is not None:
            self._monitor.cancel()
        if not clients:
            return
        for m in self.members.values():
            close = getattr(m.client, "close", None)
            if close is not None:
                await close()

    def describe(self) -> list[dict[str, Any]]:
        """JSON view: each engine's health and how many sessions stick to it."""
        counts: dict[str, int] = {}
        for url in self._sticky.values():
            counts[url] = counts.get(url, 0) + 1
        return [{"url": m.url, "healthy": m.healthy, "failures": m.failures, "last_check": m.last_check,
                 "sessions": counts.get(m.url, 0), "calls": m.calls} for m in self.members.values()]
