"""The in-process path of ``TransferQueueClient``: one put, or one ref read, when the directory and the
StorageUnit live in this process (the ``embedded`` deployment).

The client's general path handles several fields per put, remote units, and retries of full or lost
units. The calls the Proxy and a trainer make most (``put`` of one field, ``get`` of one ref) on an
in-process deployment go through here instead: the same steps (place in the directory, copy into the
unit with its checksums, commit, ref) with no lists, no retry loop and no remote-call machinery. Whatever
this path cannot finish at once (a full unit, no live unit, a unit that is not in this process) is left
to the general path, which waits, places again or raises exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dressage.errors import StorageFullError, StorageUnitUnavailable, TransferQueueError
from dressage.tq.refs import FieldRef
from dressage.tq.storage.base import StorageUnit, prepare_array
from dressage.tq.transport.wire import dtype_name

__all__ = ["LocalPath"]


class LocalPath:
    """Bound to one client; ``put`` and ``get`` return ``None`` when the general path must do the call."""

    __slots__ = ("_client", "_controller", "_units", "_node_id")

    def __init__(self, client: Any, controller: Any, units: Mapping[str, StorageUnit], node_id: str | None) -> None:
        self._client = client
        self._controller = controller
        self._units = dict(units)
        self._node_id = node_id

    @classmethod
    def for_client(cls, client: Any, controller: Any, units: Mapping[str, StorageUnit],
                   node_id: str | None) -> "LocalPath | None":
        """A path when the directory is in this process and every unit is an in-process backend."""
        if getattr(controller, "remote", False) or not units:
            return None
        if not all(not u.remote and hasattr(u, "put_local") for u in units.values()):
            return None
        return cls(client, controller, units, node_id)

    def put(self, field: str, array: Any, batch: str | None, key: str | None) -> FieldRef | None:
        """The ref of ``array`` stored on an in-process unit, or ``None`` (nothing stored) for the general path."""
        if not isinstance(field, str) or not field:
            raise TransferQueueError(f"field must be a non-empty string, got {field!r}")
        if batch is not None and not isinstance(batch, str):
            raise TransferQueueError(f"batch must be a string or None, got {batch!r}")
        if key is None:
            key = self._client._new_key()
        elif not isinstance(key, str) or not key:
            raise TransferQueueError(f"key must be a non-empty string, got {key!r}")
        data = prepare_array(array, copy=False)
        nbytes = data.nbytes
        controller = self._controller
        try:
            unit_id = controller.place_many([(key, nbytes, field)], node_id=self._node_id, batch=batch)
        except (StorageFullError, StorageUnitUnavailable):
            return None  # nothing reserved: the general path waits or raises, per on_full
        try:
            # A conversion (contiguity, byte order, list input) already made a private array: no second copy.
            self._units[unit_id].put_local(key, data, copy=data is array)
            controller.commit_many([key], unit_id=unit_id)
        except StorageFullError:
            controller.abort_many([key])
            return None
        except BaseException:
            try:
                controller.abort_many([key])
            except Exception:  # the original error is the one worth raising
                pass
            raise
        client = self._client
        with client._lock:
            client._counters.puts += 1
            client._counters.bytes_written += nbytes
        return FieldRef.of_stored(key, unit_id, field, dtype_name(data.dtype), data.shape, batch)

    def get(self, ref: Any, copy: bool, consume: bool) -> list[np.ndarray] | None:
        """``[array]`` for one ref of an in-process unit, or ``None`` for the general path."""
        if type(ref) is not FieldRef:
            return None
        unit = self._units.get(ref.unit_id)
        if unit is None:
            return None  # an unknown unit: the general path names it
        (arr,) = unit.read_local([(ref.key, ref.row_start, ref.row_stop)])
        ref.check_read(arr, ref.unit_id)
        client = self._client
        with client._lock:
            c = client._counters
            c.get_calls += 1
            c.refs_requested += 1
            c.get_requests += 1
            c.rows_read += arr.shape[0]
            c.bytes_read += arr.nbytes
        if consume:
            self._controller.mark_consumed({ref.key})
        return [np.array(arr, copy=True) if copy else arr]
