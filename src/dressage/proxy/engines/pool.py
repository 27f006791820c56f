"""Several engines behind one Proxy: sticky sessions placed by load, health checks, failover.

A session keeps the engine it was first placed on (the least loaded, ties broken on a hash ring),
so the engine's prefix cache serves every turn.
An engine that fails a call or its health check leaves the ring at once; its sessions move to the
next engine on the ring at their next call, and the move is reported so the caller can record the
boundary. With a ``discovery`` (a router's worker list) the members follow what it lists.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from dressage.errors import EngineError, NoHealthyEngineError

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
    listed: bool = True
    """Listed by the discovery (always, without one); an unlisted member takes no new session."""
    router_healthy: bool = True
    """What the discovery says of its health (the Proxy's own view is ``healthy``)."""
    in_flight: int = 0
    """Calls of this Proxy running on it now: it gets aborts and updates while any runs."""
    version_behind: str | None = None
    """A weight version it missed while unreachable: it takes no session until a probe sets it."""

    @property
    def placeable(self) -> bool:
        return self.healthy and self.listed and self.router_healthy and self.version_behind is None


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
    """Engines keyed by URL on a hash ring of ``vnodes`` points each (the tie-break among equally
    loaded engines).

    ``failures_to_remove`` consecutive failed checks take an engine out; one passing check
    brings it back (sessions already moved stay where they are).
    """

    def __init__(self, clients: Sequence[Any], *, vnodes: int = 64, failures_to_remove: int = 1,
                 check_timeout_s: float = 2.0, discovery: Any = None) -> None:
        if not clients and discovery is None:
            raise ValueError("an engine pool needs at least one engine")
        self.members: dict[str, EngineMember] = {}
        for c in clients:
            url = str(getattr(c, "base_url", f"engine-{len(self.members)}"))
            if url in self.members:
                raise ValueError(f"engine {url} is listed twice")
            self.members[url] = EngineMember(url, c)
        self.discovery = discovery
        """A :class:`~.discovery.RouterDiscovery` the members come from (``None``: the clients given)."""
        self.failures_to_remove = int(failures_to_remove)
        self.check_timeout_s = float(check_timeout_s)
        self.vnodes = int(vnodes)
        self._points: list[int] = []
        self._owners: list[str] = []
        self._rebuild()
        self._sticky: dict[str, str] = {}
        self._unsettled: dict[str, str] = {}
        self.moves: list[_Move] = []
        self._monitor: asyncio.Task | None = None
        self._probes: set[asyncio.Task] = set()

    def _rebuild(self) -> None:
        listed = [url for url, m in self.members.items() if m.listed]
        ring = sorted((_hash(f"{url}#{i}"), url) for url in listed for i in range(self.vnodes))
        self._points = [p for p, _ in ring]
        self._owners = [u for _, u in ring]

    # ---------------------------------------------------------------- placement
    def _ring_owner(self, session_id: str) -> str:
        """The least loaded placeable engine (sessions sticking to it), the first on the ring from the
        session's point among equals: new sessions spread by load, and the choice is stable."""
        loads: dict[str, int] = {url: 0 for url, m in self.members.items() if m.placeable}
        for url in self._sticky.values():
            if url in loads:
                loads[url] += 1
        if not loads:
            raise NoHealthyEngineError(f"no healthy engine among {', '.join(self.members) or 'none listed yet'}")
        least = min(loads.values())
        start = bisect.bisect(self._points, _hash(session_id))
        n = len(self._points)
        for k in range(n):
            url = self._owners[(start + k) % n]
            if loads.get(url) == least:
                return url
        raise NoHealthyEngineError(f"no healthy engine among {', '.join(self.members)}")

    def place(self, session_id: str) -> Placement:
        """The engine for the session's next call (sticky; moved if its engine is out).

        ``moved_from`` stays set until :meth:`settle`: a call that fails after the move must not
        hide it from the retry.
        """
        current = self._sticky.get(session_id)
        if current is not None and self.members[current].placeable:
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
        """One fixed engine: nothing to fail over to (a discovered pool never is)."""
        return len(self.members) == 1 and self.discovery is None

    def member_for(self, client: Any) -> EngineMember | None:
        """The member whose client ``client`` is."""
        return next((m for m in self.members.values() if m.client is client), None)

    # ------------------------------------------------------------- membership
    def sync(self, workers: Sequence[Any]) -> None:
        """Follow a discovery's list (``url`` and ``healthy`` of each worker): new ones join the ring,
        missing ones leave it (kept while calls of ours run on them, for aborts and updates)."""
        seen = set()
        changed = False
        for w in workers:
            seen.add(w.url)
            m = self.members.get(w.url)
            if m is None:
                m = self.members[w.url] = EngineMember(w.url, self.discovery.client_for(w.url))
                changed = True
            elif not m.listed:
                m.listed, changed = True, True
            m.router_healthy = bool(w.healthy)
        for url, m in list(self.members.items()):
            if url in seen or not m.listed:
                continue
            m.listed, changed = False, True
        if changed:
            self._rebuild()

    async def refresh(self) -> None:
        """Ask the discovery for its workers once and follow them (no-op without one)."""
        if self.discovery is not None:
            self.sync(await self.discovery.workers())

    def control_targets(self) -> list[EngineMember]:
        """Who takes aborts and version updates: every listed member, and any running a call of ours."""
        return [m for m in self.members.values() if m.listed or m.in_flight]

    # ------------------------------------------------------------------ health
    async def check(self) -> list[str]:
        """Probe every listed engine's ``/health`` once; returns the URLs taken out by this round.

        One that passes and missed a weight version (``version_behind``) gets it set before it
        takes sessions again.
        """
        members = self.control_targets()
        results = await asyncio.gather(*(m.client.health(timeout=self.check_timeout_s) for m in members),
                                       return_exceptions=True)
        removed = []
        for m, ok in zip(members, results):
            m.last_check = time.time()
            if ok is True:
                m.failures, m.healthy = 0, True
                if m.version_behind is not None:
                    await self._catch_up(m)
                continue
            m.failures += 1
            if m.healthy and m.failures >= self.failures_to_remove:
                m.healthy = False
                removed.append(m.url)
        return removed

    async def _catch_up(self, m: EngineMember) -> None:
        version = m.version_behind
        try:
            answer = await m.client.update_weight_version(version, timeout=self.check_timeout_s * 5)
        except EngineError:
            return  # still behind: asked again at the next check
        if not (isinstance(answer, dict) and answer.get("success") is False) and m.version_behind == version:
            m.version_behind = None

    def report_failure(self, client: Any) -> None:
        """A call on ``client`` failed: its member takes no new session from now on, and is probed
        at once (a passing probe brings it back). No-op with one fixed engine."""
        m = self.member_for(client)
        if m is None or self.single:
            return
        m.healthy = False
        try:
            task = asyncio.get_running_loop().create_task(self.check())
        except RuntimeError:
            return  # no loop: the periodic check probes it
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    def ensure_monitor(self, interval_s: float) -> None:
        """Start the periodic health check (and discovery refresh) on the running loop (once; no-op
        with one fixed engine)."""
        if interval_s <= 0 or self.single or (self._monitor is not None and not self._monitor.done()):
            return
        self._monitor = asyncio.get_running_loop().create_task(self._watch(interval_s))

    async def _watch(self, interval_s: float) -> None:
        while True:
            if self.members or self.discovery is None:  # a discovery that listed nothing yet is asked at once
                await asyncio.sleep(interval_s)
            else:
                await asyncio.sleep(min(interval_s, 0.5))
            try:
                await self.refresh()
            except EngineError:
                pass  # the router is away: keep the workers last listed, probed below
            await self.check()

    async def close(self, *, clients: bool = True) -> None:
        """Stop the health checks; with ``clients``, close each member's client (the discovery's) too."""
        if self._monitor is not None:
            self._monitor.cancel()
        for task in list(self._probes):
            task.cancel()
        if not clients:
            return
        if self.discovery is not None:
            await self.discovery.close()
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
                 "sessions": counts.get(m.url, 0), "calls": m.calls, "in_flight": m.in_flight,
                 "listed": m.listed, "router_healthy": m.router_healthy, "version_behind": m.version_behind}
                for m in self.members.values()]
