"""The writer's side of placement leases (the protocol: ``tq/directory/lease.py``): a client's puts (up to
``LEASE_PUT_MAX``) written to a leased unit while their placement travels to the Controller, so a put
costs one round trip.
A ``FastWrite`` of the client's one put path, for a Controller in another process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dressage.errors import StorageFullError, StorageUnitUnavailable, TransferQueueError
from dressage.tq.client.writes import PendingPut, abort_quietly, unit_of
from dressage.tq.directory.lease import LEASE_PUT_MAX
from dressage.tq.storage.base import StorageUnit

__all__ = ["LeasedWrite"]

log = logging.getLogger(__name__)

_NO_LEASE_RETRY_S = 0.5  # after the Controller had no lease to give, puts are placed each this long


@dataclass(slots=True)
class _Held:
    lease_id: str
    left: dict[str, int]  # unit_id -> bytes of the lease this client has not used there
    puts: dict[str, int]
    use_until: float


class LeasedWrite:
    """A client's side: one lease at a time, shared by the client's threads, used for half its life (so
    no put reaches the Controller after the lease ended there, short of a stall of seconds)."""

    commit_rides = True  # the commit rides on the client's next placement (``SoonCommits``)

    def __init__(self, controller: Any, units: Mapping[str, StorageUnit], node_id: str | None, view: Any | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._controller = controller
        self._units = units
        self._node_id = node_id
        self._view = view  # the client's LivenessView: which units are dead
        self._dead: Callable[[str], str | None] | None = view.reason if view is not None else None
        self._clock = clock
        self._lock = threading.Lock()
        self._held: _Held | None = None
        self._none_until = 0.0
        self.granted = 0  # leases this client got (each one a Controller round trip)

    @classmethod
    def for_client(cls, controller: Any, units: Mapping[str, StorageUnit], node_id: str | None,
                   view: Any | None) -> "LeasedWrite | None":
        """Leases only save a round trip to a Controller in another process."""
        if getattr(controller, "remote", False) and hasattr(controller, "place_leased_begin"):
            return cls(controller, units, node_id, view)
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

    def write(self, put: PendingPut) -> str | None:
        """Write a put (up to ``LEASE_PUT_MAX``) to the leased unit with its keys' placement in flight at the
        same time; the unit id once both succeeded (the caller commits then), None when the put should be
        placed the regular way (no lease, or the unit was full or unavailable: nothing of it is left recorded)."""
        names, placing = put.keys, put.placing
        if put.nbytes > LEASE_PUT_MAX:
            return None
        # A stale view of unit states is refreshed by the placement's reply, not by a round trip first.
        refresh = self._view is not None and self._view.begin_refresh()
        got = self.take(put.nbytes)
        if got is None:
            if refresh:
                self._view.finish_refresh(None)  # type: ignore[union-attr]
            return None
        lease_id, unit_id = got
        unit = unit_of(self._units, unit_id)
        pending = self._controller.place_leased_begin(lease_id, unit_id, placing, batch=put.batch, states=refresh)
        try:
            unit.put_many(list(zip(names, put.arrays)), copy=True)
        except BaseException as exc:
            if self._settle(pending, refresh) is None:  # recorded: drop the pending keys as any failed put does
                abort_quietly(self._controller, names, unit_down=isinstance(exc, StorageUnitUnavailable))
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
