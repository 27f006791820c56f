"""Placement leases: a writer places many puts without a Controller round trip each.

A lease is capacity the Controller sets aside for one client (``lease``) on every unit a put would be
placed on right now (the writer's node first, the head node last: the pool ``_choose`` picks from), on
each at most ``LEASE_MAX_BYTES`` and 1/``LEASE_SHARE`` of its free bytes, for ``LEASE_TTL_S``. The client
spreads its puts (up to ``LEASE_PUT_MAX``) over the lease's units as placement does (most bytes left, then
fewest puts: equal units fill evenly) and writes each to its unit while the put's keys travel to the Controller in
the same moment (``place_leased``, sent before the unit write, its reply read after it), so the two
round trips overlap and a put costs one. The directory rules do not change: ``place_leased`` records the
keys as pending (write-once is checked there; a refusal fails the whole put and queues its unit copy for
deletion), the put returns once both answered, and the commit that follows makes them visible, as for
every put. Accounting stays exact: a unit's ``directory_bytes`` are its keys' bytes and ``leased_bytes``
the rest of its live leases; ``place_leased`` moves bytes from one to the other, and a lease that
expires, is returned (a new lease, the client closing, a failed write) or whose unit dies gives its rest
back.

Here: the Controller's side (``LeaseDesk``, composed by the Controller) and ``SoonCommits`` (the remote
directory handle's commit coalescing); the writer's side is ``tq/client/leases.py``.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dressage.errors import TransferQueueError

__all__ = ["COMMIT_SOON_S", "LEASE_MAX_BYTES", "LEASE_PUT_MAX", "LEASE_SHARE", "LEASE_TTL_S", "LeaseDesk",
           "SoonCommits"]

log = logging.getLogger(__name__)

LEASE_TTL_S = 10.0              # the Controller ends a lease this long after granting it
LEASE_MAX_BYTES = 64 << 20      # the most one lease sets aside
LEASE_SHARE = 8                 # ... and at most this fraction (1/8) of the unit's free bytes
# Puts up to this size go through a lease, larger ones are placed each: half a lease's most, so a lease
# of full size carries at least two per unit, and as much as a PutBatcher round (its ``max_bytes``), so
# the Proxy's writer overlaps every round's placement with its write. A round of 32 MiB crosses a 25 Gbit/s
# link in ~11 ms; the ~1 ms placement before it was a tenth of that.
LEASE_PUT_MAX = LEASE_MAX_BYTES // 2


@dataclass(slots=True)
class _Lease:
    parts: dict[str, int]  # unit_id -> bytes still set aside there
    expires: float


class LeaseDesk:
    """The leases a Controller granted and the bytes they set aside per unit.

    A collaborator of :class:`dressage.tq.directory.controller.Controller`, which calls it under its own
    lock (the desk has none) and owns everything else: units, budgets, keys. The desk only books
    capacity: ``grant`` sets it aside, ``take`` moves it to a put, ``end`` / ``sweep`` / ``end_unit``
    give the rest back.
    """

    __slots__ = ("_leases", "_leased")

    def __init__(self) -> None:
        self._leases: dict[str, _Lease] = {}
        self._leased: dict[str, int] = {}

    def __bool__(self) -> bool:
        """Whether any lease is live (until the next ``sweep``)."""
        return bool(self._leases)

    def leased(self, unit_id: str) -> int:
        """Bytes of ``unit_id`` that live leases hold aside: not free for anyone else."""
        return self._leased.get(unit_id, 0)

    def grant(self, fitting: Sequence[str], nbytes: int, free: Callable[[str], int], now: float) -> dict[str, Any]:
        """A lease on every unit of ``fitting`` (at least ``nbytes`` each): its wire form."""
        parts = {u: max(nbytes, min(LEASE_MAX_BYTES, free(u) // LEASE_SHARE)) for u in fitting}
        lease_id = secrets.token_hex(8)
        self._leases[lease_id] = _Lease(parts, now + LEASE_TTL_S)
        for uid, size in parts.items():
            self._leased[uid] = self._leased.get(uid, 0) + size
        return {"lease": lease_id, "parts": dict(parts), "ttl_s": LEASE_TTL_S}

    def left(self, lease_id: str, unit_id: str) -> int:
        """Bytes the lease still holds aside on ``unit_id`` (0 once it is used up, ended or unknown)."""
        lease = self._leases.get(lease_id)
        return lease.parts.get(unit_id, 0) if lease is not None else 0

    def take(self, lease_id: str, unit_id: str, nbytes: int) -> None:
        """Move ``nbytes`` (at most ``left``) from the lease's part on ``unit_id`` to a put's keys."""
        if nbytes:
            self._leases[lease_id].parts[unit_id] -= nbytes
            self._leased[unit_id] -= nbytes

    def end(self, lease_id: str, unit_id: str | None = None) -> None:
        """End a lease, or only its part on ``unit_id``."""
        lease = self._leases.get(lease_id)
        if lease is None:
            return
        for uid in [unit_id] if unit_id is not None else list(lease.parts):
            self._leased[uid] -= lease.parts.pop(uid, 0)
        if not lease.parts:
            del self._leases[lease_id]

    def sweep(self, now: float) -> None:
        """End the leases whose time ran out."""
        for lease_id in [i for i, lease in self._leases.items() if lease.expires <= now]:
            self.end(lease_id)

    def end_unit(self, unit_id: str) -> None:
        """The unit died: no lease places anything more there."""
        for lease_id in [i for i, lease in self._leases.items() if unit_id in lease.parts]:
            self.end(lease_id, unit_id)

    def stats(self, unit_id: str, now: float) -> dict[str, int]:
        self.sweep(now)
        return {"leased_bytes": self._leased.get(unit_id, 0),
                "leases": sum(1 for lease in self._leases.values() if unit_id in lease.parts)}


COMMIT_SOON_S = 0.002  # a leased put's commit waits at most this long for the next message to ride on


class SoonCommits:
    """A leased put's commit, sent with the client's next placement or within ``COMMIT_SOON_S``.

    A put on a lease returns once its unit and its placement answered; its commit (one-way anyway) rides
    on the next ``place_leased`` of the client, so a stream of small puts sends one message to the
    Controller each instead of two, and a flusher thread sends what is still owed after
    ``COMMIT_SOON_S`` (or at close). The keys are pending until then, as they are until any one-way
    commit lands; a commit that arrives after its keys were cleared queues the unit copies for deletion."""

    def __init__(self, send: Callable[[list[list[Any]], bool], None]) -> None:
        self._send = send  # sends [[keys, unit_id], ...]: one-way, or (the last, at close) awaited briefly
        self._lock = threading.Lock()
        self._owed: list[list[Any]] = []
        self._since = 0.0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def owe(self, keys: list[str], unit_id: str | None) -> None:
        with self._lock:
            if not self._owed:
                self._since = time.monotonic()
            self._owed.append([keys, unit_id])
            start = self._thread is None and not self._closed
            if start:
                self._thread = threading.Thread(target=self._run, name="tq-commit-soon", daemon=True)
        if start:
            self._thread.start()  # type: ignore[union-attr]
        self._wake.set()

    def take(self) -> list[list[Any]]:
        """What is owed, for a message about to be sent (``give_back`` it if that send fails)."""
        with self._lock:
            owed, self._owed = self._owed, []
        return owed

    def give_back(self, owed: list[list[Any]]) -> None:
        if owed:
            with self._lock:
                self._owed[:0] = owed
                self._since = time.monotonic() - COMMIT_SOON_S  # owed for long enough already
            self._wake.set()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            if self._stop.wait(COMMIT_SOON_S):
                return
            with self._lock:
                due = bool(self._owed) and time.monotonic() - self._since >= COMMIT_SOON_S
                owed = self.take_locked() if due else []
                if self._owed:
                    self._wake.set()  # owed, but not for long enough yet: look again
            self._flush(owed)

    def take_locked(self) -> list[list[Any]]:
        owed, self._owed = self._owed, []
        return owed

    def _flush(self, owed: list[list[Any]], last: bool = False) -> None:
        if not owed:
            return
        try:
            self._send(owed, last)
        except TransferQueueError:  # the Controller is gone: retention or a clear removes the keys
            log.warning("could not send the commit of %d put(s)", len(owed))

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._stop.set()
        self._wake.set()
        self._flush(self.take(), last=True)  # a one-way send could die with the closing socket
