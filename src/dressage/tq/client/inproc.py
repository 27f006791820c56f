"""The in-process fast case of ``TransferQueueClient`` (the ``embedded`` deployment): the directory and
every StorageUnit live in this process.

Its write is a ``FastWrite`` of the client's one put path: a one-field put (the call the Proxy makes
most) is placed and copied into the unit with no retry loop, and not copied twice when preparing it
already made a private array. A one-ref read goes to the unit's ``read_local`` with no request
grouping. Whatever this cannot finish at once (a full unit, no live unit, several fields) it declines,
leaving nothing recorded, and the plain path waits, places again or raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dressage.errors import StorageFullError, StorageUnitUnavailable
from dressage.tq.client.writes import PendingPut, abort_quietly
from dressage.fields.refs import FieldRef
from dressage.tq.storage.base import StorageUnit

__all__ = ["InProcess"]


class InProcess:
    """Bound to one client's directory and units; ``write`` and ``read`` return None to decline."""

    __slots__ = ("_controller", "_units", "_node_id")

    commit_rides = False  # an in-process commit is a call, not a message

    def __init__(self, controller: Any, units: Mapping[str, StorageUnit], node_id: str | None) -> None:
        self._controller = controller
        self._units = dict(units)
        self._node_id = node_id

    @classmethod
    def for_client(cls, controller: Any, units: Mapping[str, StorageUnit], node_id: str | None) -> "InProcess | None":
        """The fast case when the directory is in this process and every unit is an in-process backend."""
        if getattr(controller, "remote", False) or not units:
            return None
        if not all(not u.remote and hasattr(u, "put_local") for u in units.values()):
            return None
        return cls(controller, units, node_id)

    def write(self, put: PendingPut) -> str | None:
        # docstring inherited from tq/client/writes.py:FastWrite
        if len(put.keys) != 1:
            return None
        controller = self._controller
        try:
            unit_id = controller.place_many(put.placing, node_id=self._node_id, batch=put.batch)
        except (StorageFullError, StorageUnitUnavailable):
            return None  # nothing reserved: the plain path waits or raises, per on_full
        key = put.keys[0]
        try:
            # A conversion (contiguity, byte order, list input) already made a private array: no second copy.
            self._units[unit_id].put_local(key, put.arrays[0], copy=not put.private[0])
        except StorageFullError:
            controller.abort_many([key])
            return None
        except BaseException:
            abort_quietly(controller, [key])
            raise
        return unit_id

    def close(self) -> None:
        pass

    def read(self, ref: Any) -> np.ndarray | None:
        """The checked rows of one ref of an in-process unit (a read-only view), or None for the plain path."""
        if type(ref) is not FieldRef:
            return None
        unit = self._units.get(ref.unit_id)
        if unit is None:
            return None  # an unknown unit: the plain path names it
        (arr,) = unit.read_local([(ref.key, ref.row_start, ref.row_stop)])
        ref.check_read(arr, ref.unit_id)
        return arr
