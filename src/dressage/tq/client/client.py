"""TransferQueueClient: put / get_many / delete / clear against a Controller and its StorageUnits.

The same class serves every deployment: it holds a directory handle (the in-process Controller or a
remote one) and one StorageUnit handle per unit (in-process backends or ZMQ remotes). Reads go straight
to units using the unit id inside each FieldRef; the Controller is only asked where to write, what to
clear, and (through a cached ``LivenessView``) which units are dead, so reads of a dead unit's keys fail at
once and a put whose unit died is placed again on a live one.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dressage.errors import (
    KeyNotFoundError,
    StorageFullError,
    StorageUnitUnavailable,
    TransferQueueError,
)
from dressage.tq.client.inproc import LocalPath
from dressage.tq.directory.lease import LeaseHolder
from dressage.tq.directory.liveness import LivenessView
from dressage.tq.refs import FieldRef
from dressage.tq.storage.base import StorageUnit, prepare_array
from dressage.tq.transport.wire import dtype_name

__all__ = ["TransferQueueClient", "ClientCounters"]

_FULL_BACKOFF_S = (0.005, 0.2)  # first and largest sleep between retries of a full unit (on_full: wait)


@dataclass(slots=True)
class ClientCounters:
    """What this client moved. ``get_requests`` counts unit round trips, so 0 proves no TQ read happened."""

    puts: int = 0
    bytes_written: int = 0
    get_calls: int = 0
    get_requests: int = 0
    rows_read: int = 0
    bytes_read: int = 0
    refs_requested: int = 0
    deletes: int = 0
    full_waits: int = 0           # times a put backed off because every unit was full (on_full: wait)
    replaced_puts: int = 0        # puts placed again because their first unit died before answering

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class TransferQueueClient:
    """Writes fields to StorageUnits and reads them back by FieldRef. Thread-safe.

    ``get_many`` results are read-only arrays (views of the unit's memory when it is in-process, of the
    received frames otherwise); pass ``copy=True`` for writable arrays.
    """

    def __init__(self, controller: Any, units: Mapping[str, StorageUnit], *, node_id: str | None = None,
                 on_full: str = "spill", full_wait_s: float = 30.0, owns_handles: bool = False,
                 spec: dict[str, Any] | None = None) -> None:
        self._controller = controller
        self._remote_controller = bool(getattr(controller, "remote", False))
        self._units = dict(units)
        self.node_id = node_id
        self._on_full = on_full
        self._full_wait_s = float(full_wait_s)
        self._owns_handles = owns_handles
        self._spec = spec
        self._lock = threading.Lock()
        self._counters = ClientCounters()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        # Keys: a random per-client prefix plus a counter; unique across clients and cheap per put.
        self._key_prefix = uuid.uuid4().hex[:16]
        self._key_seq = itertools.count()
        self._liveness = LivenessView(controller) if hasattr(controller, "unit_states") else None
        self._local = LocalPath.for_client(self, controller, self._units, node_id)  # None: no in-process path
        if self._liveness is not None:
            for uid, unit in self._units.items():
                attach = getattr(unit, "attach_liveness", None)
                if attach is not None:
                    attach(self._liveness.checker(uid))
        self._leases = LeaseHolder.for_client(controller, node_id, self._liveness)  # small puts (tq/directory/lease.py)

    @classmethod
    def connect(cls, spec: Mapping[str, Any], *, node_id: str | None = None) -> "TransferQueueClient":
        """A client in another process (a trainer reader, a Ray actor) from ``TransferQueue.client_spec()``."""
        from dressage.tq.client.spec import connect_spec  # ZMQ only when needed

        return connect_spec(cls, spec, node_id=node_id)

    # -- write ---------------------------------------------------------------------------------
    def put(self, field: str, array: np.ndarray, *, batch: str | None = None, key: str | None = None) -> FieldRef:
        """Store ``array`` and return its FieldRef once it is durable in the unit.

        On any failure nothing stays behind: the directory entry is dropped and the unit copy, if one was
        made, is queued for deletion.
        """
        self._check_open()
        ref = None if self._local is None else self._local.put(field, array, batch, key)
        return ref or self.put_many([(field, array)], batch=batch, keys=None if key is None else [key])[0]

    def put_many(self, items: Sequence[tuple[str, np.ndarray]], *, batch: str | None = None,
                 keys: Sequence[str] | None = None) -> list[FieldRef]:
        """Store several ``(field, array)`` items of one step on one unit: place, unit write, commit (on a
        lease the placement overlaps the write and nobody waits for the commit). All or nothing."""
        self._check_open()
        if batch is not None and not isinstance(batch, str):
            raise TransferQueueError(f"batch must be a string or None, got {batch!r}")
        if not items:
            return []
        if keys is not None and len(keys) != len(items):
            raise TransferQueueError(f"put_many got {len(items)} items but {len(keys)} keys")
        fields, arrays = [], []
        for field, array in items:
            if not isinstance(field, str) or not field:
                raise TransferQueueError(f"field must be a non-empty string, got {field!r}")
            fields.append(field)
            arrays.append(prepare_array(array, copy=False))
        names = [self._new_key() for _ in items] if keys is None else list(keys)
        for key in names:
            if not isinstance(key, str) or not key:
                raise TransferQueueError(f"key must be a non-empty string, got {key!r}")
        placing = [(k, a.nbytes, f) for k, a, f in zip(names, arrays, fields)]
        unit_id = self._leases.put(self, names, arrays, placing, batch) if self._leases is not None else None
        leased = unit_id is not None
        deadline = time.monotonic() + self._full_wait_s
        sleep = _FULL_BACKOFF_S[0]
        lost_units: list[str] = []
        while not leased:
            unit_id = None
            try:
                unit_id = self._controller.place_many(placing, node_id=self.node_id, batch=batch)
                self._unit(unit_id).put_many(list(zip(names, arrays)), copy=True)
            except StorageFullError:
                if unit_id is not None:
                    self._abort_quietly(names)
                if self._on_full != "wait" or time.monotonic() + sleep > deadline:
                    raise
                with self._lock:
                    self._counters.full_waits += 1
                time.sleep(sleep)  # space appears when a trainer clears a batch
                sleep = min(sleep * 2, _FULL_BACKOFF_S[1])
                continue
            except StorageUnitUnavailable:
                if unit_id is None:
                    raise  # the directory itself, or no live unit at all
                self._abort_quietly(names, unit_down=True)  # later puts go to other units
                lost_units.append(unit_id)
                # Nothing was acknowledged yet: try a live unit this put has not tried, once each.
                if len(lost_units) >= len(self._units):
                    raise
                with self._lock:
                    self._counters.replaced_puts += 1
                continue
            except BaseException:
                if unit_id is not None:
                    self._abort_quietly(names)
                raise
            break
        try:
            if self._remote_controller:
                # Durable in the unit is what put promises; the directory learns it without a round trip.
                soon = {"soon": True} if leased else {}  # a leased put's commit rides on the next placement
                self._controller.commit_many(names, unit_id=unit_id, wait=False, **soon)
            else:
                self._controller.commit_many(names, unit_id=unit_id)
        except BaseException:
            self._abort_quietly(names)
            raise
        with self._lock:
            self._counters.puts += len(arrays)
            self._counters.bytes_written += sum(n for _, n, _ in placing)
        # The arrays were prepared above (plain dtype, at least one axis): their metadata needs no re-check.
        return [FieldRef.of_stored(k, unit_id, f, dtype_name(a.dtype), a.shape, batch)
                for k, a, f in zip(names, arrays, fields)]

    def _new_key(self) -> str:
        return f"{self._key_prefix}-{next(self._key_seq):x}"

    def _abort_quietly(self, keys: list[str], *, unit_down: bool = False) -> None:
        try:
            self._controller.abort_many(keys, unit_down=unit_down)
        except Exception:  # the original error is the one worth raising; retention cleans up
            pass

    def put_async(self, field: str, array: np.ndarray, *, batch: str | None = None,
                  key: str | None = None) -> "Future[FieldRef]":
        """``put`` on the client's thread pool. The caller must not modify ``array`` until it resolves."""
        self._check_open()
        return self._executor().submit(self.put, field, array, batch=batch, key=key)

    async def aput(self, field: str, array: np.ndarray, *, batch: str | None = None,
                   key: str | None = None) -> FieldRef:
        return await asyncio.wrap_future(self.put_async(field, array, batch=batch, key=key))

    def put_many_async(self, items: Sequence[tuple[str, np.ndarray]], *, batch: str | None = None,
                       keys: Sequence[str] | None = None) -> "Future[list[FieldRef]]":
        self._check_open()
        return self._executor().submit(self.put_many, items, batch=batch, keys=keys)

    async def aput_many(self, items: Sequence[tuple[str, np.ndarray]], *, batch: str | None = None,
                        keys: Sequence[str] | None = None) -> list[FieldRef]:
        return await asyncio.wrap_future(self.put_many_async(items, batch=batch, keys=keys))

    # -- read ----------------------------------------------------------------------------------
    def get_many(self, refs: Sequence[FieldRef], *, copy: bool = False, consume: bool = False) -> list[np.ndarray]:
        """Arrays for ``refs``, in order: one round trip per unit, identical requests read once, and
        only each ref's rows cross the wire. ``consume=True`` marks the keys consumed."""
        self._check_open()
        refs = list(refs)
        if len(refs) == 1 and self._local is not None:
            out = self._local.get(refs[0], copy, consume)
            if out is not None:
                return out
        per_unit: dict[str, list[tuple[str, int, int]]] = {}
        seen: dict[tuple[str, str, int, int], tuple[str, int]] = {}
        slots: list[tuple[str, int]] = []
        for ref in refs:
            if not isinstance(ref, FieldRef):
                raise TransferQueueError(f"get_many takes FieldRefs, got {type(ref).__name__}")
            ident = (ref.unit_id, ref.key, ref.row_start, ref.row_stop)
            slot = seen.get(ident)  # type: ignore[arg-type]
            if slot is None:
                reqs = per_unit.get(ref.unit_id)
                if reqs is None:
                    self._unit(ref.unit_id)  # unknown units fail before any read
                    reqs = per_unit[ref.unit_id] = []
                slot = seen[ident] = (ref.unit_id, len(reqs))  # type: ignore[index]
                reqs.append((ref.key, ref.row_start, ref.row_stop))  # type: ignore[arg-type]
            slots.append(slot)
        if self._liveness is not None:
            for unit_id, reqs in per_unit.items():
                why = self._liveness.reason(unit_id) if self._units[unit_id].remote else None
                if why:
                    keys = [k for k, _, _ in reqs]
                    raise StorageUnitUnavailable(
                        f"StorageUnit {unit_id} is unavailable ({why}); keys: "
                        + ", ".join(map(repr, keys[:8])) + (" ..." if len(keys) > 8 else ""))
        results = self._read_units(per_unit)
        out = []
        for ref, (unit_id, idx) in zip(refs, slots):
            arr = results[unit_id][idx]
            ref.check_read(arr, unit_id)
            out.append(np.array(arr, copy=True) if copy else arr)
        rows = nbytes = 0
        for arrays in results.values():
            for a in arrays:
                rows += a.shape[0]
                nbytes += a.nbytes
        with self._lock:
            c = self._counters
            c.get_calls += 1
            c.refs_requested += len(refs)
            c.get_requests += len(per_unit)
            c.rows_read += rows
            c.bytes_read += nbytes
        if consume and refs:
            self._controller.mark_consumed({r.key for r in refs})
        return out

    def _read_units(self, per_unit: dict[str, list[tuple[str, int, int]]]) -> dict[str, list[np.ndarray]]:
        units = self._units
        # In-process units read through ``read_local``: the views stay in this process (verify_local_reads).
        readers = {uid: units[uid].get_many if units[uid].remote else units[uid].read_local for uid in per_unit}
        if len(per_unit) == 1 or sum(units[uid].remote for uid in per_unit) <= 1:
            return {uid: readers[uid](reqs) for uid, reqs in per_unit.items()}
        # Several remote units: ask them all at once so the slowest, not the sum, sets the latency.
        futures = {uid: self._executor().submit(readers[uid], reqs) for uid, reqs in per_unit.items()}
        return {uid: fut.result() for uid, fut in futures.items()}

    def get(self, ref: FieldRef, *, copy: bool = False) -> np.ndarray:
        return self.get_many([ref], copy=copy)[0]

    async def aget_many(self, refs: Sequence[FieldRef], *, copy: bool = False,
                        consume: bool = False) -> list[np.ndarray]:
        self._check_open()
        fut = self._executor().submit(self.get_many, refs, copy=copy, consume=consume)
        return await asyncio.wrap_future(fut)

    # -- lifecycle -----------------------------------------------------------------------------
    def delete(self, refs_or_keys: Iterable[FieldRef | str]) -> int:
        """Remove keys everywhere now; returns how many the directory knew."""
        self._check_open()
        keys = list(dict.fromkeys(r.key if isinstance(r, FieldRef) else str(r) for r in refs_or_keys))
        return self._drop(self._controller.delete(keys))

    def clear(self, batch: str) -> int:
        """Remove every key of a finished batch from every unit; returns the number of keys removed."""
        self._check_open()
        if not isinstance(batch, str):
            raise TransferQueueError(f"clear takes a batch name, got {batch!r}")
        return self._drop(self._controller.clear(batch))

    def _drop(self, placement: dict[str, list[str]]) -> int:
        # The directory already forgot the keys and queued the unit deletions; deleting here as well
        # makes the call synchronous (idempotent, so the janitor's later pass is harmless).
        failed: list[BaseException] = []
        for unit_id, keys in placement.items():
            unit = self._units.get(unit_id)
            if unit is None:
                continue
            if self._liveness is not None and unit.remote and self._liveness.reason(unit_id):
                continue  # the directory keeps these deletions queued until the unit answers again
            try:
                unit.delete(keys)
            except Exception as exc:  # the janitor retries; report after trying every unit
                failed.append(exc)
        n = sum(len(k) for k in placement.values())
        with self._lock:
            self._counters.deletes += n
        if failed:
            raise failed[0]
        return n

    def mark_consumed(self, refs_or_keys: Iterable[FieldRef | str]) -> int:
        self._check_open()
        return self._controller.mark_consumed({r.key if isinstance(r, FieldRef) else str(r) for r in refs_or_keys})

    def set_batch(self, refs_or_keys: Iterable[FieldRef | str], batch: str | None) -> int:
        """Move keys to another batch (e.g. once the rollout step that will consume them is known)."""
        self._check_open()
        return self._controller.set_batch(
            {r.key if isinstance(r, FieldRef) else str(r) for r in refs_or_keys}, batch)

    @property
    def counters(self) -> ClientCounters:
        """A snapshot of this client's counters."""
        with self._lock:
            return ClientCounters(**self._counters.as_dict())

    def reset_counters(self) -> None:
        with self._lock:
            self._counters = ClientCounters()

    @property
    def unit_ids(self) -> list[str]:
        return list(self._units)

    def total_keys(self) -> int:
        """Keys the Controller's directory holds, across every unit (0 once every batch was released)."""
        return int(self._controller.total_keys())

    def dead_units(self) -> dict[str, str]:
        """``{unit_id: reason}`` of the units the Controller has marked dead (as of at most 0.2 s ago)."""
        if self._liveness is None:
            return {}
        return {u: why for u in self._units if (why := self._liveness.reason(u))}

    def _unit(self, unit_id: str) -> StorageUnit:
        try:
            return self._units[unit_id]
        except KeyError:
            raise KeyNotFoundError(f"StorageUnit {unit_id!r} is not part of this TransferQueue") from None

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="tq-client")
            return self._pool

    def _check_open(self) -> None:
        if self._closed:
            raise TransferQueueError("TransferQueueClient is closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._leases is not None:
            self._leases.close()
        if self._owns_handles:
            for unit in self._units.values():
                unit.close()
            close = getattr(self._controller, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> "TransferQueueClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
