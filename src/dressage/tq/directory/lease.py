"""Placement leases: a writer places many small puts without a Controller round trip each.

A lease is capacity the Controller sets aside for one client (``lease``) on every unit a put would be
placed on right now (the writer's node first, the head node last: the pool ``_choose`` picks from), on
each at most ``LEASE_MAX_BYTES`` and 1/``LEASE_SHARE`` of its free bytes, for ``LEASE_TTL_S``. The client
spreads its small puts over the lease's units as placement does (most bytes left, then fewest puts:
equal units fill evenly) and writes each to its unit while the put's keys travel to the Controller in
the same moment (``place_leased``, sent before the unit write, its reply read after it), so the two
round trips overlap and a put costs one. The directory rules do not change: ``place_leased`` records the
keys as pending (write-once is checked there; a refusal fails the whole put and queues its unit copy for
deletion), the put returns once both answered, and the commit that follows makes them visible, as for
every put. Accounting stays exact: a unit's ``directory_bytes`` are its keys' bytes and ``leased_bytes``
the rest of its live leases; ``place_leased`` moves bytes from one to the other, and a lease that
expires, is returned (a new lease, the client closing, a failed write) or whose unit dies gives its rest
back.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dressage.errors import StorageFullError, StorageUnitUnavailable, TransferQueueError

__all__ = ["COMMIT_SOON_S", "LEASE_MAX_BYTES", "LEASE_PUT_MAX", "LEASE_SHARE", "LEASE_TTL_S", "LeaseDesk",
           "LeaseHolder", "SoonCommits"]

log = logging.getLogger(__name__)

LEASE_TTL_S = 10.0              # the Controller ends a lease this long after granting it
LEASE_MAX_BYTES = 64 << 20      # the most one lease sets aside
LEASE_SHARE = 8                 # ... and at most this fraction (1/8) of the unit's free bytes
LEASE_PUT_MAX = 4 << 20         # puts up to this size go through a lease; larger ones are placed each
_NO_LEASE_RETRY_S = 0.5         # after the Controller had no lease to give, puts are placed each this long


@dataclass(slots=True)
class _Lease:
    parts: dict[str, int]  # unit_id -> bytes still set aside there
    expires: float


class LeaseDesk:
    """The Controller's side (a mixin of :class:`dressage.tq.directory.controller.Controller`, under its lock)."""

    _lock: threading.Lock
    _units: dict[str, Any]
    _used: dict[str, int]
    _count: dict[str, int]
    _entries: dict[str, Any]
    _tombstones: Any
    _clock: Callable[[], float]
    _strict: bool

    def _init_leases(self) -> None:
        self._leases: dict[str, _Lease] = {}
        self._leased: dict[str, int] = {}

    # -- under the Controller's lock ---------------------------------------------------------
    def _free(self, unit_id: str) -> int:
        return self._units[unit_id].memory_budget - self._used[unit_id] - self._leased.get(unit_id, 0)

    def _check_new_keys(self, items: Sequence[tuple[str, int, str]], what: str) -> None:
        """Keys are write-once: a repeated or known key is an error before anything is recorded."""
        keys = [k for k, _, _ in items]
        if len(set(keys)) != len(keys):
            raise TransferQueueError(f"{what} got the same key twice")
        for key in keys:
            if key in self._entries:
                raise TransferQueueError(f"key {key!r} already exists; keys are write-once")

    def _record_pending(self, unit_id: str, items: Sequence[tuple[str, int, str]], batch: str | None) -> None:
        """New keys ``(key, nbytes, field)`` as pending on ``unit_id``, their bytes charged to it."""
        from dressage.tq.directory.controller import KeyState, _Entry

        now = self._clock()
        for key, nbytes, field in items:
            self._entries[key] = _Entry(unit_id, int(nbytes), batch, field, KeyState.PENDING, now, now)
            self._used[unit_id] += int(nbytes)
            self._count[unit_id] += 1
            self._tombstones.pop(key, None)

    def _end_lease(self, lease_id: str, unit_id: str | None = None) -> None:
        """End a lease, or only its part on ``unit_id``."""
        lease = self._leases.get(lease_id)
        if lease is None:
            return
        for uid in [unit_id] if unit_id is not None else list(lease.parts):
            self._leased[uid] -= lease.parts.pop(uid, 0)
        if not lease.parts:
            del self._leases[lease_id]

    def _sweep_leases(self, now: float) -> None:
        for lease_id in [i for i, lease in self._leases.items() if lease.expires <= now]:
            self._end_lease(lease_id)

    def _end_unit_leases(self, unit_id: str) -> None:
        """The unit died: no lease places anything more there."""
        for lease_id in [i for i, lease in self._leases.items() if unit_id in lease.parts]:
            self._end_lease(lease_id, unit_id)

    def _lease_stats(self, unit_id: str) -> dict[str, int]:
        self._sweep_leases(self._clock())
        return {"leased_bytes": self._leased.get(unit_id, 0),
                "leases": sum(1 for lease in self._leases.values() if unit_id in lease.parts)}

    # -- the operations ------------------------------------------------------------------------
    def lease(self, nbytes: int, *, node_id: str | None = None, returning: str | None = None) -> dict[str, Any] | None:
        """Set capacity aside for a writer's next puts (at least ``nbytes`` on each unit), ending the
        lease ``returning`` first. ``{"lease", "parts": {unit_id: bytes}, "ttl_s"}``, or None when no
        live unit has room (the writer places each put then, and learns why from that)."""
        with self._lock:
            if returning is not None:
                self._end_lease(returning)
            if not self._units:
                return None
            nbytes = int(nbytes)
            try:
                fitting, _, _ = self._candidates(nbytes, node_id)  # type: ignore[attr-defined]
            except StorageUnitUnavailable:
                return None
            if not fitting:
                return None
            parts = {u: max(nbytes, min(LEASE_MAX_BYTES, self._free(u) // LEASE_SHARE)) for u in fitting}
            lease_id = secrets.token_hex(8)
            self._leases[lease_id] = _Lease(parts, self._clock() + LEASE_TTL_S)
            for uid, size in parts.items():
                self._leased[uid] = self._leased.get(uid, 0) + size
            return {"lease": lease_id, "parts": dict(parts), "ttl_s": LEASE_TTL_S}

    def return_lease(self, lease_id: str) -> None:
        """The writer is done with the lease: its rest is free again."""
        with self._lock:
            self._end_lease(lease_id)

    def place_leased(self, lease_id: str, unit_id: str, items: Sequence[tuple[str, int, str]], *,
                     batch: str | None = None) -> None:
        """Record new keys ``(key, nbytes, field)`` as pending on the lease's unit, their bytes taken from
        the lease (once it is used up or gone, charged to the unit as ``place_many`` does). Keys are
        write-once; a dead unit is StorageUnitUnavailable; nothing is recorded when anything is refused."""
        with self._lock:
            if unit_id not in self._units:
                raise TransferQueueError(f"place_leased: unknown StorageUnit {unit_id!r}")
            if not self._is_live(unit_id):  # type: ignore[attr-defined]
                raise StorageUnitUnavailable(f"StorageUnit {unit_id} is dead; its leases ended")
            self._check_new_keys(items, "place_leased")
            lease = self._leases.get(lease_id)
            left = lease.parts.get(unit_id, 0) if lease is not None else 0
            total = sum(int(n) for _, n, _ in items)
            take = min(left, total)
            if self._strict and total - take > self._free(unit_id):
                raise StorageFullError(f"StorageUnit {unit_id} is full and the lease for these keys is used up")
            if take:
                lease.parts[unit_id] -= take  # type: ignore[union-attr]
                self._leased[unit_id] -= take
            self._record_pending(unit_id, items, batch)


@dataclass(slots=True)
class _Held:
    lease_id: str
    left: dict[str, int]  # unit_id -> bytes of the lease this client has not used there
    puts: dict[str, int]
    use_until: float


class LeaseHolder:
    """A client's side: one lease at a time, shared by the client's threads, used for half its life (so
    no put reaches the Controller after the lease ended there, short of a stall of seconds)."""

    def __init__(self, controller: Any, node_id: str | None, view: Any | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._controller = controller
        self._node_id = node_id
        self._view = view  # the client's LivenessView: which units are dead
        self._dead: Callable[[str], str | None] | None = view.reason if view is not None else None
        self._clock = clock
        self._lock = threading.Lock()
        self._held: _Held | None = None
        self._none_until = 0.0
        self.granted = 0  # leases this client got (each one a Controller round trip)

    @classmethod
    def for_client(cls, controller: Any, node_id: str | None, view: Any | None) -> "LeaseHolder | None":
        """Leases only save a round trip to a Controller in another process."""
        if getattr(controller, "remote", False) and hasattr(controller, "place_leased_begin"):
            return cls(controller, node_id, view)
        return None

    def _pick(self, held: _Held, nbytes: int) -> str | None:
        best = None
        for uid, left in held.left.items():
            if left >= nbytes and (best is None or (left, -held.puts[uid]) > (held.left[best], -held.puts[best])):
                best = uid
        if best is not None and self._dead is not None and self._dead(best):
            del held.left[best]  # the Controller ended that part when it marked the unit dead
            return self._pick(held, nbytes)
        return best

    def take(self, nbytes: int) -> tuple[str, str] | None:
        """``(lease_id, unit_id)`` with ``nbytes`` debited, or None: place this put the regular way."""
        with self._lock:
            now = self._clock()
            held, returning = self._held, None
            unit_id = self._pick(held, nbytes) if held is not None and held.use_until > now else None
            if held is not None and unit_id is None:
                returning, held = held.lease_id, None
                self._held = None
            if held is None:
                if now < self._none_until and returning is None:
                    return None
                try:
                    grant = self._controller.lease(nbytes, node_id=self._node_id, returning=returning)
                except TransferQueueError:
                    grant = None
                if grant is None:
                    self._none_until = now + _NO_LEASE_RETRY_S
                    return None
                parts = {str(u): int(n) for u, n in grant["parts"].items()}
                held = self._held = _Held(str(grant["lease"]), parts, dict.fromkeys(parts, 0),
                                          now + float(grant["ttl_s"]) / 2)
                self.granted += 1
                unit_id = self._pick(held, nbytes)
                if unit_id is None:
                    return None
            held.left[unit_id] -= nbytes
            held.puts[unit_id] += 1
            return held.lease_id, unit_id

    def drop(self, lease_id: str, unit_id: str | None = None) -> None:
        """Stop using a lease, or its part on ``unit_id`` (that unit failed or refused a write); a lease
        with no part left goes back."""
        with self._lock:
            if self._held is None or self._held.lease_id != lease_id:
                return
            if unit_id is not None:
                self._held.left.pop(unit_id, None)
                if self._held.left:
                    return
            self._held = None
        self._return_quietly(lease_id)

    def close(self) -> None:
        with self._lock:
            held, self._held = self._held, None
        if held is not None:
            self._return_quietly(held.lease_id, wait=True)

    def _return_quietly(self, lease_id: str, wait: bool = False) -> None:
        try:
            self._controller.return_lease(lease_id, wait=wait)
        except TransferQueueError:  # the lease ends at the Controller by itself
            pass

    def put(self, client: Any, names: list[str], arrays: list[Any], placing: list[tuple[str, int, str]],
            batch: str | None) -> str | None:
        """Write a small put to the leased unit with its keys' placement in flight at the same time; the
        unit id once both succeeded (the caller commits then), None when the put should be placed the
        regular way (no lease, or the unit was full or unavailable: nothing of it is left recorded)."""
        total = sum(n for _, n, _ in placing)
        if total > LEASE_PUT_MAX:
            return None
        # A stale view of unit states is refreshed by the placement's reply, not by a round trip first.
        refresh = self._view is not None and self._view.begin_refresh()
        got = self.take(total)
        if got is None:
            if refresh:
                self._view.finish_refresh(None)  # type: ignore[union-attr]
            return None
        lease_id, unit_id = got
        unit = client._unit(unit_id)
        pending = self._controller.place_leased_begin(lease_id, unit_id, placing, batch=batch, states=refresh)
        try:
            unit.put_many(list(zip(names, arrays)), copy=True)
        except BaseException as exc:
            if self._settle(pending, refresh) is None:  # recorded: drop the pending keys as any failed put does
                client._abort_quietly(names, unit_down=isinstance(exc, StorageUnitUnavailable))
            else:  # nothing recorded; a unit that timed out may hold a copy all the same
                self._forget_copies(unit_id, names)
            if isinstance(exc, (StorageFullError, StorageUnitUnavailable)):
                self.drop(lease_id, unit_id)
                return None
            raise
        refused = self._settle(pending, refresh)
        if refused is not None:
            self._forget_copies(unit_id, names)
            if isinstance(refused, (StorageFullError, StorageUnitUnavailable)):
                self.drop(lease_id, unit_id)
                return None
            raise refused
        return unit_id

    def _settle(self, pending: Any, refresh: bool) -> BaseException | None:
        """Wait for the placement's reply: None when it was recorded, else the error that refused it."""
        states = None
        try:
            reply, _ = pending.wait()
            states = reply.get("states")
        except TransferQueueError as exc:
            return exc
        finally:
            if refresh:
                self._view.finish_refresh(states if isinstance(states, dict) else None)  # type: ignore[union-attr]
        return None

    def _forget_copies(self, unit_id: str, keys: list[str]) -> None:
        try:
            self._controller.requeue_deletions(unit_id, keys)
        except TransferQueueError:  # the Controller is gone: so is the whole deployment's directory
            log.warning("could not queue the deletion of %d unrecorded key(s) on unit %s", len(keys), unit_id)



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
