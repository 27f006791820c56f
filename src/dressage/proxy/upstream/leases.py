"""Read leases: what a two-phase ``/trajectory/read`` handed out and not yet acknowledged.

A read that leases (or drains) hands its trajectories out under a ``read_id``; batch reads skip them
until the reader acknowledges (they are forgotten), releases them, or the lease expires (they are
readable again). A named read takes what it names from another lease; that lease remembers what was
taken, so its reader learns at its ack which sessions are its own. Nothing here forgets a trajectory:
:class:`~dressage.proxy.upstream.trajectories.Trajectories` does, once the reader said it holds what it read.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable

from dressage.errors import ConfigError, SessionStateError, UnknownReadError

__all__ = ["ReadLeases", "Lease", "DEFAULT_LEASE_S"]

DEFAULT_LEASE_S = 600.0


@dataclass(slots=True)
class Lease:
    read_id: str
    session_ids: list[str]
    """The sessions it holds now."""
    expires_at: float
    """On the leases' clock (``time.monotonic()`` unless a test gives another)."""
    acknowledged: list[str] = field(default_factory=list)
    """Sessions the ack of this read forgot: their TQ keys are its reader's."""
    taken: list[str] = field(default_factory=list)
    """Sessions a named read took over from it: that read's reader holds them (and their keys)."""
    how: str | None = None
    """How it ended (``acknowledged``, ``released``, ``expired``, ``taken over``); ``None`` while open."""


class ReadLeases:
    """Open leases by read id, the session each leased trajectory is held by, and how ended reads ended.

    ``clock``: the time leases expire by. ``remember``: how many ended reads are kept, so that a
    repeated ack answers the same (the same sessions) and an ack after expiry says so;
    ``remember_sessions`` bounds the session ids they keep in all (the oldest reads go first).
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, remember: int = 10_000,
                 remember_sessions: int = 1_000_000) -> None:
        self.clock = clock
        self.remember = int(remember)
        self.remember_sessions = int(remember_sessions)
        self.open: dict[str, Lease] = {}
        self._holder: dict[str, str] = {}
        self._ended: OrderedDict[str, Lease] = OrderedDict()
        self._ended_sessions = 0
        self.expired = 0
        """Leases that ran out before an ack: their trajectories were handed out again."""

    @staticmethod
    def check_lease_s(value: object, name: str = "lease_s") -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        return float(value)

    def held(self, session_id: str) -> str | None:
        """The read id holding ``session_id`` (after expiring what ran out), or ``None``."""
        return self._holder.get(session_id)

    def expire(self) -> list[str]:
        """End the leases that ran out; returns the sessions readable again."""
        now = self.clock()
        freed: list[str] = []
        for rid in [rid for rid, lease in self.open.items() if lease.expires_at <= now]:
            freed += self._end(rid, "expired")
            self.expired += 1
        return freed

    def grant(self, session_ids: Iterable[str], lease_s: float) -> Lease:
        """Lease ``session_ids`` under a new read id; a session another lease held moves to this one
        (a named read takes exactly what it names), and that lease lists it as ``taken``."""
        sids = list(session_ids)
        for sid in sids:
            old = self._holder.get(sid)
            if old is not None:
                lease = self.open[old]
                lease.session_ids.remove(sid)
                lease.taken.append(sid)
                if not lease.session_ids:
                    self._end(old, "taken over")
        lease = Lease(secrets.token_urlsafe(12), sids, self.clock() + lease_s)
        self.open[lease.read_id] = lease
        for sid in sids:
            self._holder[sid] = lease.read_id
        return lease

    def lease(self, read_id: str) -> Lease:
        """The open lease ``read_id``: 409 when it ended (expired, released), 404 when never granted."""
        lease = self.open.get(read_id)
        if lease is not None:
            return lease
        ended = self._ended.get(read_id)
        if ended is None:
            raise UnknownReadError(f"unknown read_id {read_id!r}")
        raise SessionStateError(f"read {read_id} is {ended.how}; its trajectories were readable again")

    def ended(self, read_id: str) -> Lease | None:
        """The ended read ``read_id`` (its ``how``, what it acknowledged and what was taken), if remembered."""
        return self._ended.get(read_id)

    def finish(self, read_id: str, how: str) -> list[str]:
        """End the open lease ``read_id`` (``acknowledged`` / ``released``); returns its sessions."""
        return self._end(read_id, how)

    def acknowledged_before(self, read_id: str, session_ids: Iterable[str]) -> None:
        """Remember read ``read_id`` as acknowledged, forgetting ``session_ids`` (an ack a journal replay found):
        a repeat of its ack answers ``already`` and those sessions, a release names them."""
        self.open[read_id] = Lease(read_id, [], 0.0, acknowledged=list(session_ids))
        self._end(read_id, "acknowledged")

    def drop(self, session_id: str) -> None:
        """A leased session left (forgotten, discarded): its lease no longer covers it."""
        rid = self._holder.pop(session_id, None)
        if rid is not None:
            lease = self.open[rid]
            lease.session_ids.remove(session_id)

    def _end(self, read_id: str, how: str) -> list[str]:
        lease = self.open.pop(read_id)
        for sid in lease.session_ids:
            if self._holder.get(sid) == read_id:
                del self._holder[sid]
        held = list(lease.session_ids)
        lease.session_ids.clear()  # an ended read holds nothing; what it acknowledged and lost is kept
        lease.how = how
        self._ended[read_id] = lease
        self._ended_sessions += len(lease.acknowledged) + len(lease.taken)
        while self._ended and (len(self._ended) > self.remember or self._ended_sessions > self.remember_sessions):
            _, old = self._ended.popitem(last=False)
            self._ended_sessions -= len(old.acknowledged) + len(old.taken)
        return held

    def __len__(self) -> int:
        return len(self.open)
