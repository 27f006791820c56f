"""The TransferQueue Controller: a directory of keys, never a holder of payload bytes.

It knows where each key lives, its size, when it was written, its batch and its state, whether each
StorageUnit is live or dead, places new keys (live units only: writer's node first, then most free
capacity) and queues deletions. Every method is a short in-memory operation under one lock, so no client,
however slow, can stall the others; unit I/O happens in the ``Janitor`` and liveness threads or in
clients, never inside a Controller call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dressage.errors import StorageFullError, StorageUnitUnavailable, TransferQueueError
from dressage.tq.directory.entries import Entry, KeyState, Liveness, UnitInfo, UnitState
from dressage.tq.directory.lease import LeaseDesk

__all__ = ["Controller"]

log = logging.getLogger(__name__)
_TOMBSTONES = 100_000  # how many cleared keys the directory remembers, for ``state()``
_PLACEMENTS_KEPT = 4096  # how many leased placements the directory remembers by id, to answer a resend
_DELETED_UNKNOWN_KEPT = 1_000_000  # unknown keys deleted while a unit awaits adoption, remembered at most
UNIT_DOWN_S = 10.0    # a unit a writer found unavailable gets no new keys for this long
# What one unit's directory may hold however placements are sent: far above any real unit, far below
# the int64 that every counter of ``stats`` must stay within.
MAX_UNIT_DIRECTORY_BYTES = 1 << 56


class Controller:
    """Thread-safe key directory; its placement leases are booked by a ``LeaseDesk`` (``tq/directory/lease.py``).
    ``clock`` is injectable."""

    def __init__(self, units: Sequence[UnitInfo] = (), *, retention_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, strict_budget: bool = False) -> None:
        """``strict_budget``: refuse to place keys that fit no live unit's budget (StorageFullError),
        so with ``on_full: wait|error`` a writer learns it must wait before it sends any payload."""
        self._lock = threading.Lock()
        self._units: dict[str, UnitInfo] = {}
        self._used: dict[str, int] = {}
        self._count: dict[str, int] = {}
        self._entries: dict[str, Entry] = {}
        self._tombstones: OrderedDict[str, str] = OrderedDict()
        self._to_delete: dict[str, set[str]] = {}
        # Queued deletions of unit copies that may have landed after a caller deleted them itself (a
        # commit or an abandoned write that came after the key was cleared): ``deleted`` leaves them queued.
        self._late_copies: set[tuple[str, str]] = set()
        # Recent leased placements by the id their writer gave them (-> unit id): one sent again after its
        # reply was lost (a stream that timed out: sent again on ZMQ) is answered as the first was.
        self._placements: OrderedDict[str, str] = OrderedDict()
        self._retention_s = retention_s
        self._clock = clock
        self._cleared_total = 0
        self._down_until: dict[str, float] = {}
        self._live: dict[str, Liveness] = {}
        self._unadopted: set[str] = set()  # units whose contents a restarted directory has not taken in yet
        # Keys deleted while some unit's contents were still to be adopted and the directory knew them not:
        # they may be on that unit, and its adoption must not bring them back (emptied once all are adopted).
        self._deleted_unknown: set[str] = set()
        self._strict = strict_budget
        self._leases = LeaseDesk()  # used under self._lock only
        for u in units:
            self.add_unit(u)

    # -- units ---------------------------------------------------------------------------------
    def add_unit(self, unit: UnitInfo) -> None:
        with self._lock:
            self._units[unit.unit_id] = unit
            self._used.setdefault(unit.unit_id, 0)
            self._count.setdefault(unit.unit_id, 0)
            self._live.setdefault(unit.unit_id, Liveness(UnitState.LIVE, self._clock()))

    # -- liveness ------------------------------------------------------------------------------
    def mark_unit_dead(self, unit_id: str, reason: str) -> bool:
        """Mark a unit dead (no new keys; clients fail its reads at once). True if it was live."""
        with self._lock:
            live = self._live.get(unit_id)
            if live is None:
                return False
            if live.state is UnitState.DEAD:
                return False
            self._live[unit_id] = Liveness(UnitState.DEAD, self._clock(), str(reason), live.last_seen)
            self._leases.end_unit(unit_id)
        log.warning("StorageUnit %s marked dead: %s", unit_id, reason)
        return True

    def mark_unit_live(self, unit_id: str) -> bool:
        """A unit answered: record it, and bring it back if it was dead. True if it was dead."""
        with self._lock:
            live = self._live.get(unit_id)
            if live is None:
                return False
            now = self._clock()
            live.last_seen = now
            if live.state is UnitState.LIVE:
                return False
            self._live[unit_id] = Liveness(UnitState.LIVE, now, f"answered again after: {live.reason}", now)
            self._down_until.pop(unit_id, None)
        log.warning("StorageUnit %s is live again", unit_id)
        return True

    def unit_states(self) -> dict[str, dict[str, Any]]:
        """``{unit_id: {"state", "for_s", "reason", "seen_s_ago"}}``: what clients check before a read."""
        with self._lock:
            now = self._clock()
            return {uid: {"state": lv.state.value, "for_s": round(now - lv.since, 3), "reason": lv.reason,
                          "seen_s_ago": None if lv.last_seen is None else round(now - lv.last_seen, 3)}
                    for uid, lv in self._live.items()}

    def dead_reason(self, unit_id: str) -> str | None:
        """Why the unit is dead, or None while it is live (the check in-process handles attach)."""
        with self._lock:
            lv = self._live.get(unit_id)
            if lv is None or lv.state is UnitState.LIVE:
                return None
            return f"marked dead {self._clock() - lv.since:.1f} s ago: {lv.reason}"

    def _is_live(self, unit_id: str) -> bool:
        lv = self._live.get(unit_id)
        return lv is None or lv.state is UnitState.LIVE

    def units(self) -> list[UnitInfo]:
        with self._lock:
            return list(self._units.values())

    # -- write path ----------------------------------------------------------------------------
    def place(self, key: str, nbytes: int, *, node_id: str | None = None, batch: str | None = None,
              field: str = "") -> str:
        """Reserve ``nbytes`` for a new key and return the unit that should store it."""
        return self.place_many([(key, nbytes, field)], node_id=node_id, batch=batch)

    def place_many(self, items: Sequence[tuple[str, int, str]], *, node_id: str | None = None,
                   batch: str | None = None) -> str:
        """Reserve space for new keys ``(key, nbytes, field)`` on one unit (one write round trip) and
        return that unit. Keys are write-once: a known key is an error and nothing is reserved."""
        with self._lock:
            if not self._units:
                raise StorageFullError("the TransferQueue has no StorageUnits")
            self._check_new_keys(items, "place_many")
            unit_id = self._choose(sum(int(n) for _, n, _ in items), node_id)
            self._check_bounded(unit_id, items)
            self._record_pending(unit_id, items, batch)
            return unit_id

    def _claim_adopted(self, unit_id: str, items: Sequence[tuple[str, int, str]],
                       batch: str | None) -> list[tuple[str, int, str]]:
        """A leased put writes its payload while its placement is on the way: when the Controller was
        started again in between, it adopted the key from the unit already. Such a placement (same key,
        unit and size) is the writer claiming it, not a second write: it takes its batch and field."""
        rest = []
        for item in items:
            entry = self._entries.get(item[0])
            if entry is not None and entry.adopted and entry.unit_id == unit_id and entry.nbytes == int(item[1]):
                entry.adopted, entry.batch, entry.field = False, batch, item[2]
            else:
                rest.append(item)
        return rest

    def _check_bounded(self, unit_id: str, items: Sequence[tuple[str, int, str]]) -> None:
        total = sum(int(n) for _, n, _ in items)
        if self._used[unit_id] + total > MAX_UNIT_DIRECTORY_BYTES:
            raise StorageFullError(f"StorageUnit {unit_id}: placing {total} more bytes would take its directory past "
                                   f"{MAX_UNIT_DIRECTORY_BYTES} bytes ({self._used[unit_id]} placed)")

    def _candidates(self, nbytes: int, node_id: str | None) -> tuple[list[str], list[str], list[str]]:
        """The units of the first pool where ``nbytes`` fit, the last pool, and every unit usable now."""
        now = self._clock()
        self._leases.sweep(now)
        live = [u for u in self._units if self._is_live(u)]
        if not live:
            raise StorageUnitUnavailable(
                "no live StorageUnit to place keys on: " + "; ".join(
                    f"{u} dead ({self._live[u].reason})" for u in self._units))
        up = [u for u in live if self._down_until.get(u, 0.0) <= now]
        everyone = up or live  # if every live unit failed a writer lately, let the writer find out again
        # Payload stays off the head node (it runs the Controller, the Proxy, the RolloutManager) while
        # a unit elsewhere has room, even for a writer on the head: its unit is the last resort.
        off_head = [u for u in everyone if not self._units[u].head]
        local = [u for u in off_head if node_id is not None and self._units[u].node_id == node_id]
        for pool in (local, off_head, everyone):
            fitting = [u for u in pool if self._free(u) >= nbytes]
            if fitting:
                return fitting, pool, everyone
        return [], local or off_head or everyone, everyone

    def _choose(self, nbytes: int, node_id: str | None) -> str:
        if len(self._units) == 1 and not self._leases:  # one unit (embedded): no pool to search
            uid = next(iter(self._units))
            if self._live[uid].state is UnitState.LIVE and (not self._strict or self._free(uid) >= nbytes):
                return uid
        fitting, last, everyone = self._candidates(nbytes, node_id)
        if fitting:
            # Most free bytes, then fewest keys: equal units fill evenly.
            return max(fitting, key=lambda u: (self._free(u), -self._count[u]))
        if self._strict:
            # Sending the payload would only be refused: the writer waits (or fails) without sending it.
            raise StorageFullError(
                f"every live StorageUnit is full: {nbytes} bytes fit none of "
                + ", ".join(f"{u} ({self._free(u)} of {self._units[u].memory_budget} bytes free)" for u in everyone))
        # Nobody has room: the unit with most room spills, waits or refuses, per its policy.
        return max(last, key=lambda u: (self._free(u), -self._count[u]))

    def _free(self, unit_id: str) -> int:
        return self._units[unit_id].memory_budget - self._used[unit_id] - self._leases.leased(unit_id)

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
        now = self._clock()
        for key, nbytes, field in items:
            self._entries[key] = Entry(unit_id, int(nbytes), batch, field, KeyState.PENDING, now, now)
            self._used[unit_id] += int(nbytes)
            self._count[unit_id] += 1
            self._tombstones.pop(key, None)

    def adopt(self, unit_id: str, items: Iterable[tuple[str, int]]) -> int:
        """Record keys a unit already holds ``(key, nbytes)`` as written there: how a restarted Controller
        rebuilds its directory from its units' contents. Keys the directory knows are left as they are, and
        so are keys it deleted from this unit meanwhile (a late adoption: put and deleted while the unit was
        out of reach; their deletion stays queued); a key deleted while the directory did not know it (put
        before the restart, deleted before this adoption) is queued for deletion here instead of taken in.
        The unit's contents count as known from now on
        (:meth:`awaits_inventory`). Returns how many were adopted."""
        n = 0
        with self._lock:
            if unit_id not in self._units:
                raise TransferQueueError(f"adopt: unknown StorageUnit {unit_id!r}")
            self._unadopted.discard(unit_id)
            now = self._clock()
            deleting = self._to_delete.get(unit_id, set())
            for key, nbytes in items:
                if key in self._deleted_unknown and key not in self._entries:  # deleted while out of reach
                    self._to_delete.setdefault(unit_id, set()).add(key)
                    continue
                if key in self._entries or key in deleting or self._tombstones.get(key) == unit_id:
                    continue
                self._entries[key] = Entry(unit_id, int(nbytes), None, "", KeyState.WRITTEN, now, now, adopted=True)
                self._used[unit_id] += int(nbytes)
                self._count[unit_id] += 1
                self._tombstones.pop(key, None)
                n += 1
            if not self._unadopted:
                self._deleted_unknown.clear()
        return n

    def await_inventory(self, unit_id: str) -> None:
        """A restarted directory could not ask ``unit_id`` what it holds: until :meth:`adopt` takes its
        inventory in, whatever is on the unit may be committed keys, never orphans."""
        with self._lock:
            if unit_id not in self._units:
                raise TransferQueueError(f"await_inventory: unknown StorageUnit {unit_id!r}")
            self._unadopted.add(unit_id)

    def awaits_inventory(self, unit_id: str) -> bool:
        """Whether ``unit_id``'s contents are still to be adopted (see :meth:`await_inventory`)."""
        with self._lock:
            return unit_id in self._unadopted

    # -- placement leases (the protocol: tq/directory/lease.py) --------------------------------
    def lease(self, nbytes: int, *, node_id: str | None = None, returning: str | None = None) -> dict[str, Any] | None:
        """Set capacity aside for a writer's next puts (at least ``nbytes`` on each unit), ending the
        lease ``returning`` first. ``{"lease", "parts": {unit_id: bytes}, "ttl_s"}``, or None when no
        live unit has room (the writer places each put then, and learns why from that)."""
        with self._lock:
            if returning is not None:
                self._leases.end(returning)
            if not self._units:
                return None
            nbytes = int(nbytes)
            try:
                fitting, _, _ = self._candidates(nbytes, node_id)
            except StorageUnitUnavailable:
                return None
            if not fitting:
                return None
            return self._leases.grant(fitting, nbytes, self._free, self._clock())

    def return_lease(self, lease_id: str) -> None:
        """The writer is done with the lease: its rest is free again."""
        with self._lock:
            self._leases.end(lease_id)

    def place_leased(self, lease_id: str, unit_id: str, items: Sequence[tuple[str, int, str]], *,
                     batch: str | None = None, put_id: str | None = None) -> None:
        """Record new keys ``(key, nbytes, field)`` as pending on the lease's unit, their bytes taken from
        the lease (once it is used up or gone, charged to the unit as ``place_many`` does). Keys are
        write-once; a dead unit is StorageUnitUnavailable; nothing is recorded when anything is refused.
        ``put_id``: the writer's id of this placement; the same placement sent again (its first reply lost)
        is answered as the first was, recording nothing twice."""
        with self._lock:
            if unit_id not in self._units:
                raise TransferQueueError(f"place_leased: unknown StorageUnit {unit_id!r}")
            if put_id is not None and put_id in self._placements:
                if self._placements[put_id] != unit_id:
                    raise TransferQueueError(f"place_leased: placement {put_id!r} was made on another unit")
                return
            if not self._is_live(unit_id):
                raise StorageUnitUnavailable(f"StorageUnit {unit_id} is dead; its leases ended")
            items = self._claim_adopted(unit_id, items, batch)
            if not items:
                return
            self._check_new_keys(items, "place_leased")
            self._check_bounded(unit_id, items)
            total = sum(int(n) for _, n, _ in items)
            covered = min(self._leases.left(lease_id, unit_id), total)
            if self._strict and total - covered > self._free(unit_id):
                raise StorageFullError(f"StorageUnit {unit_id} is full and the lease for these keys is used up")
            self._leases.take(lease_id, unit_id, covered)
            self._record_pending(unit_id, items, batch)
            if put_id is not None:
                self._placements[put_id] = unit_id
                if len(self._placements) > _PLACEMENTS_KEPT:
                    self._placements.popitem(last=False)

    def commit(self, key: str) -> None:
        """The payload is durable in its unit."""
        self.commit_many([key])

    def commit_many(self, keys: Iterable[str], *, unit_id: str | None = None) -> None:
        """Mark placed keys durable. A key the directory no longer holds (cleared or expired while its
        payload was in flight) raises; with ``unit_id`` given its unit copy is also queued for deletion,
        so a commit that nobody waits for can never leave an orphan behind."""
        missing = []
        with self._lock:
            now = self._clock()
            for key in keys:
                entry = self._entries.get(key)
                if entry is None:
                    missing.append(key)
                    if unit_id is not None:
                        self._to_delete.setdefault(unit_id, set()).add(key)
                        self._late_copies.add((unit_id, key))
                    continue
                if entry.state is KeyState.PENDING:  # never move a consumed key back
                    entry.state = KeyState.WRITTEN
                entry.touched_at = now
        if missing:
            raise TransferQueueError(
                f"commit of {len(missing)} key(s) that were cleared or expired while being written: "
                f"{', '.join(map(repr, missing[:8]))}"
            )

    def abort(self, key: str, *, unit_down: bool = False) -> None:
        """Forget a key whose write failed; the unit copy (if any) is queued for deletion.
        ``unit_down`` says the unit did not answer: it gets no new keys for ``UNIT_DOWN_S``."""
        self.abort_many([key], unit_down=unit_down)

    def abort_many(self, keys: Iterable[str], *, unit_down: bool = False) -> None:
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if unit_down and entry is not None:
                    self._down_until[entry.unit_id] = self._clock() + UNIT_DOWN_S
                self._remove(key)

    # -- lifecycle -----------------------------------------------------------------------------
    def mark_consumed(self, keys: Iterable[str]) -> int:
        return self._stamp(keys, KeyState.CONSUMED)

    def touch(self, keys: Iterable[str]) -> int:
        """Renew keys someone still holds: their retention counts from now; their state does not change.
        How a holder (the Proxy, for its live and unacknowledged sessions) keeps keys that nobody reads
        for a while out of the retention sweep. Returns how many of ``keys`` the directory holds."""
        return self._stamp(keys, None)

    def _stamp(self, keys: Iterable[str], state: KeyState | None) -> int:
        """Keys the directory holds touched now (and moved to ``state`` unless None); how many."""
        now, n = self._clock(), 0
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is not None:
                    if state is not None:
                        entry.state = state
                    entry.touched_at = now
                    n += 1
        return n

    def retention(self) -> float | None:
        """``retention_s``: how long a key nobody writes, reads, commits or touches is kept (None: kept)."""
        return self._retention_s

    def set_batch(self, keys: Iterable[str], batch: str | None) -> int:
        n = 0
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is not None:
                    entry.batch = batch
                    n += 1
        return n

    def delete(self, keys: Iterable[str]) -> dict[str, list[str]]:
        """Drop keys from the directory; returns ``{unit_id: keys}`` the caller should delete there. A key
        the directory does not know while a unit's contents are still to be adopted may be on that unit:
        its adoption deletes it there instead of taking it in."""
        out: dict[str, list[str]] = {}
        with self._lock:
            for key in keys:
                unit_id = self._remove(key)
                if unit_id is not None:
                    out.setdefault(unit_id, []).append(key)
                elif self._unadopted and key not in self._tombstones:
                    if len(self._deleted_unknown) < _DELETED_UNKNOWN_KEPT:
                        self._deleted_unknown.add(key)
                        if len(self._deleted_unknown) == _DELETED_UNKNOWN_KEPT:  # retention takes what comes back
                            log.warning("delete: %d unknown keys deleted while a unit awaits adoption; later ones "
                                        "are not remembered", _DELETED_UNKNOWN_KEPT)
        return out

    def clear(self, batch: str, *, limit: int | None = None) -> dict[str, list[str]]:
        """Drop every key of ``batch`` (at most ``limit`` of them: one page, the caller asks again until
        ``{}``); returns ``{unit_id: keys}`` as :meth:`delete` does."""
        with self._lock:
            keys = [k for k, e in self._entries.items() if e.batch == batch]
        if limit is not None:
            keys = keys[:max(1, int(limit))]
        return self.delete(keys)

    def expire(self) -> dict[str, list[str]]:
        """Retention sweep: drop keys untouched (not written, read, committed or renewed by :meth:`touch`)
        for ``retention_s``."""
        if self._retention_s is None:
            return {}
        deadline = self._clock() - self._retention_s
        with self._lock:
            keys = [k for k, e in self._entries.items() if e.touched_at < deadline]
        if keys:
            log.info("retention: clearing %d key(s) untouched for %.1f s", len(keys), self._retention_s)
        return self.delete(keys)

    def _remove(self, key: str) -> str | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._used[entry.unit_id] -= entry.nbytes
        self._count[entry.unit_id] -= 1
        self._to_delete.setdefault(entry.unit_id, set()).add(key)
        self._tombstones[key] = entry.unit_id
        if len(self._tombstones) > _TOMBSTONES:
            self._tombstones.popitem(last=False)
        self._cleared_total += 1
        return entry.unit_id

    def take_deletions(self) -> dict[str, list[str]]:
        """Hand the queued unit deletions to the janitor (deletes are idempotent, so repeats are safe)."""
        with self._lock:
            out: dict[str, list[str]] = {}
            kept: dict[str, set[str]] = {}
            for unit_id, keys in self._to_delete.items():
                if not self._is_live(unit_id):
                    kept[unit_id] = keys  # deleting on a dead unit would only time out; kept for its return
                    continue
                # A key written again after its abort is live: deleting it now would lose data.
                dead = sorted(k for k in keys if not (k in self._entries and self._entries[k].unit_id == unit_id))
                if dead:
                    out[unit_id] = dead
            self._to_delete = kept
            self._late_copies = {(u, k) for u, k in self._late_copies if u in kept}
        return out

    def requeue_deletions(self, unit_id: str, keys: Iterable[str]) -> None:
        with self._lock:
            keys = set(keys)
            self._to_delete.setdefault(unit_id, set()).update(keys)
            self._late_copies.update((unit_id, k) for k in keys)

    def deleted(self, unit_id: str, keys: Iterable[str]) -> None:
        """A caller of :meth:`delete` or :meth:`clear` deleted these keys' copies on ``unit_id`` itself:
        the janitor need not delete them again (one it already took deletes them twice, harmlessly). A
        copy queued since by a late commit or a refused write may have landed after that deletion: it
        stays queued."""
        with self._lock:
            queued = self._to_delete.get(unit_id)
            if queued is None:
                return
            late = self._late_copies
            queued.difference_update(k for k in keys if (unit_id, k) not in late)
            if not queued:
                del self._to_delete[unit_id]

    # -- queries -------------------------------------------------------------------------------
    def state(self, key: str) -> KeyState | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                return entry.state
            return KeyState.CLEARED if key in self._tombstones else None

    def where(self, keys: Iterable[str]) -> dict[str, str]:
        """``{key: unit_id}`` for keys the directory holds."""
        with self._lock:
            return {k: self._entries[k].unit_id for k in keys if k in self._entries}

    def keys(self, batch: str | None = None) -> list[str]:
        with self._lock:
            return [k for k, e in self._entries.items() if batch is None or e.batch == batch]

    def keys_page(self, batch: str | None, *, start: int, limit: int) -> tuple[list[str], int | None]:
        """At most ``limit`` of :meth:`keys` from position ``start``, and where the next page starts (None:
        that was the last): what the Controller's server answers, so no answer grows with the directory."""
        limit, start = max(1, int(limit)), max(0, int(start))
        keys = self.keys(batch)
        return keys[start:start + limit], (start + limit if start + limit < len(keys) else None)

    def total_keys(self) -> int:
        with self._lock:
            return len(self._entries)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per unit: liveness state, keys and bytes in the directory, pending writes, queued deletions."""
        with self._lock:
            pending: dict[str, int] = {}
            for e in self._entries.values():
                if e.state is KeyState.PENDING:
                    pending[e.unit_id] = pending.get(e.unit_id, 0) + 1
            now = self._clock()
            return {
                uid: {"node_id": u.node_id, "directory_keys": self._count[uid],
                      "state": self._live[uid].state.value, "state_for_s": round(now - self._live[uid].since, 3),
                      "state_reason": self._live[uid].reason,
                      "placement_paused": self._down_until.get(uid, 0.0) > self._clock(),
                      "directory_bytes": self._used[uid], "pending": pending.get(uid, 0),
                      "queued_deletes": len(self._to_delete.get(uid, ())), **self._leases.stats(uid, now)}
                for uid, u in self._units.items()
            }
