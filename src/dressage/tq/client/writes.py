"""The client's one put path, as steps: a put is prepared once (``PendingPut``), written to a unit, then
committed by the client. The write is a strategy: ``PlacedWrite`` (place in the directory, write the unit,
retry a full or lost unit) takes every put; a faster one the deployment allows (``FastWrite``: in-process,
or on a placement lease) writes the same put when it can and declines, leaving nothing recorded, when not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from dressage.errors import KeyNotFoundError, StorageFullError, StorageUnitUnavailable
from dressage.tq.storage.base import StorageUnit

__all__ = ["PendingPut", "FastWrite", "PlacedWrite", "abort_quietly", "unit_of"]

_FULL_BACKOFF_S = (0.005, 0.2)  # first and largest sleep between retries of a full unit (on_full: wait)


@dataclass(slots=True)
class PendingPut:
    """One put, checked and prepared: every write strategy writes exactly this."""

    keys: list[str]
    fields: list[str]
    arrays: list[np.ndarray]   # prepared: native byte order, contiguous, at least one axis
    private: list[bool]        # the preparation already copied it: a unit may keep it as it is
    batch: str | None
    placing: list[tuple[str, int, str]]  # (key, nbytes, field): what the directory records

    @property
    def nbytes(self) -> int:
        return sum(n for _, n, _ in self.placing)


class FastWrite(Protocol):
    """A faster way to write a put that the plain ``PlacedWrite`` would also write, with the same result."""

    commit_rides: bool
    """Whether the put's commit may ride on the next message to the Controller (a one-way commit anyway)."""

    def write(self, put: PendingPut) -> str | None:
        """The unit holding the put once its bytes are durable there and its keys are pending in the
        directory; None when this way cannot take it now (nothing of it is left recorded anywhere)."""
        ...

    def close(self) -> None:
        """Give back what the strategy holds (a lease); puts after this go the plain way."""
        ...


def unit_of(units: Mapping[str, StorageUnit], unit_id: str) -> StorageUnit:
    try:
        return units[unit_id]
    except KeyError:
        raise KeyNotFoundError(f"StorageUnit {unit_id!r} is not part of this TransferQueue") from None


def abort_quietly(controller: Any, keys: list[str], *, unit_down: bool = False) -> None:
    """Drop a failed put's keys from the directory; the error that failed it is the one worth raising."""
    try:
        controller.abort_many(keys, unit_down=unit_down)
    except Exception:  # retention cleans up what this could not
        pass


class PlacedWrite:
    """Place the put's keys on one unit, write them there; a full unit is waited for (``on_full: wait``)
    and a unit that died before answering is replaced by a live one this put has not tried."""

    def __init__(self, controller: Any, units: Mapping[str, StorageUnit], *, node_id: str | None, on_full: str,
                 full_wait_s: float, count: Callable[[str], None]) -> None:
        self._controller = controller
        self._units = units
        self._node_id = node_id
        self._on_full = on_full
        self._full_wait_s = float(full_wait_s)
        self._count = count  # bumps one of the client's counters (full_waits, replaced_puts)

    def write(self, put: PendingPut) -> str:
        names = put.keys
        self._check_can_fit(put)
        deadline = time.monotonic() + self._full_wait_s
        sleep = _FULL_BACKOFF_S[0]
        lost_units: list[str] = []
        while True:
            unit_id = None
            try:
                unit_id = self._controller.place_many(put.placing, node_id=self._node_id, batch=put.batch)
                unit_of(self._units, unit_id).put_many(list(zip(names, put.arrays)), copy=True)
            except StorageFullError:
                if unit_id is not None:
                    abort_quietly(self._controller, names)
                if self._on_full != "wait" or time.monotonic() + sleep > deadline:
                    raise
                self._count("full_waits")
                time.sleep(sleep)  # space appears when a trainer clears a batch
                sleep = min(sleep * 2, _FULL_BACKOFF_S[1])
                continue
            except StorageUnitUnavailable:
                if unit_id is None:
                    raise  # the directory itself, or no live unit at all
                abort_quietly(self._controller, names, unit_down=True)  # later puts go to other units
                lost_units.append(unit_id)
                # Nothing was acknowledged yet: try a live unit this put has not tried, once each.
                if len(lost_units) >= len(self._units):
                    raise
                self._count("replaced_puts")
                continue
            except BaseException:
                if unit_id is not None:
                    abort_quietly(self._controller, names)
                raise
            return unit_id

    def _check_can_fit(self, put: PendingPut) -> None:
        """Without spill a put lands in one unit's memory whole: one larger than every unit's entire
        budget can never fit, so it fails at once instead of waiting out ``full_wait_s`` for space."""
        if self._on_full == "spill" or not self._units:
            return
        largest = max(int(u.memory_budget) for u in self._units.values())
        if put.nbytes > largest:
            raise StorageFullError(
                f"a put of {put.nbytes} bytes can never fit: it is larger than the whole memory budget of every "
                f"StorageUnit (largest {largest} bytes) and on_full is {self._on_full!r}, which does not spill; "
                "raise transfer_queue.unit_memory_budget or split the put")
