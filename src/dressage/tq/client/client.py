"""TransferQueueClient: put / get_many / delete / clear against a Controller and its StorageUnits.

The same class serves every deployment: it holds a directory handle (the in-process Controller or a
remote one) and one StorageUnit handle per unit (in-process backends or ZMQ remotes). Reads go straight
to units using the unit id inside each FieldRef; the Controller is only asked where to write, what to
clear, and (through a cached ``LivenessView``) which units are dead, so reads of a dead unit's keys fail at
once and a put whose unit died is placed again on a live one. Every put takes one path (prepare, write,
commit); the write is a strategy (``tq/client/writes.py``): in-process or leased when the deployment
allows, else placed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dressage.errors import StorageUnitUnavailable, TransferQueueError
from dressage.tq.client.inproc import InProcess
from dressage.tq.client.leases import LeasedWrite
from dressage.tq.client.writes import FastWrite, PendingPut, PlacedWrite, abort_quietly, unit_of
from dressage.tq.directory.liveness import LivenessView
from dressage.fields.refs import FieldRef
from dressage.tq.storage.base import StorageUnit, prepare_array
from dressage.fields.refs import dtype_name
from dressage.tq.transport.bulk import RecvPool, shared_pool
from dressage.tq.transport.wire import MAX_KEY_BYTES, MAX_TEXT, max_keys

__all__ = ["TransferQueueClient", "ClientCounters"]

log = logging.getLogger(__name__)


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
    deletes_deferred: int = 0     # deleted keys whose unit could not be reached: the janitor deletes them

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def default_read_streams() -> int:
    """How many StorageUnits one ``get_many`` reads at once: one per unit up to half the CPUs this process
    may run on, at least one. Each stream's bytes cost the reader a receive copy and a tag check on a core of
    its own (both run without the GIL); with no core to spare, streams side by side only take turns with
    each other and with the units sending them (on two cores, a 3-unit batch read in parallel took 26-28 ms
    and 26-27 ms of the reader's CPU, one unit after another 24-26 ms and 19 ms)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus // 2)


def _owned_copy(arr: np.ndarray) -> np.ndarray:
    """A writable copy of ``arr``. From 1 MiB up (``RecvPool.MIN_BYTES``) it lands in a buffer of the
    process's receive pool (``bulk.RecvPool``, exact size): a trainer that drops one Step's arrays before
    it reads the next gets the same, already written pages back, where a fresh allocation may have the
    kernel fault in and zero every page first (on this kind of VM a 654 MB restore took 1.3 s into fresh
    pages against 51 ms into written ones; a 1-2 MiB one, repeated, up to 3.5x a memcpy)."""
    if arr.nbytes < RecvPool.MIN_BYTES:
        return np.array(arr, copy=True)
    out = shared_pool().take(arr.nbytes, exact=True).view(arr.dtype).reshape(arr.shape)
    np.copyto(out, arr)
    return out


def check_name(value: Any, what: str, max_len: int = MAX_KEY_BYTES, *, empty: bool = False) -> str:
    """``value`` if it is a string every deployment can carry: at most ``max_len`` characters (the wire's
    bound of a key or field name, ``MAX_TEXT`` for a batch), non-empty unless ``empty``, and UTF-8 text (no
    lone surrogate); else TransferQueueError naming ``what``. The client's one check of names, so the
    embedded and remote deployments refuse the same ones before anything is sent or stored."""
    if not isinstance(value, str) or len(value) > max_len or not (value or empty):
        got = (f"a string of {len(value)} characters" if isinstance(value, str) and value
               else f"{type(value).__name__} {value!r:.60}")
        raise TransferQueueError(f"{what} must be a {'' if empty else 'non-empty '}string of at most {max_len} "
                                 f"characters, got {got}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise TransferQueueError(f"{what} {value!r:.60} is not UTF-8 text: {exc.reason} at character "
                                     f"{exc.start}") from None
    return value


def check_batch(batch: Any, what: str = "batch") -> str | None:
    """``batch`` if it is None or a name :func:`check_name` accepts (empty allowed, up to ``MAX_TEXT``)."""
    return None if batch is None else check_name(batch, what, MAX_TEXT, empty=True)


def keys_of(refs_or_keys: Any, what: str) -> list[str]:
    """The keys of an iterable of FieldRefs or key strings, each checked (:func:`check_name`). A bare
    string (or bytes) is refused: iterating it would name each of its characters."""
    if refs_or_keys is None or isinstance(refs_or_keys, (str, bytes, bytearray, memoryview, FieldRef)):
        one = "" if refs_or_keys is None else ", not one " + ("ref" if isinstance(refs_or_keys, FieldRef) else "string")
        raise TransferQueueError(f"{what} takes a list of FieldRefs or keys{one}, got {type(refs_or_keys).__name__} "
                                 f"{refs_or_keys!r:.60}" + ("; wrap a single one in a list" if one else ""))
    try:
        items = iter(refs_or_keys)
    except TypeError:
        raise TransferQueueError(f"{what} takes a list of FieldRefs or keys, got {type(refs_or_keys).__name__} "
                                 f"{refs_or_keys!r:.60}") from None
    keys = []
    for r in items:
        if isinstance(r, FieldRef):
            r = r.key
        elif not isinstance(r, str):
            raise TransferQueueError(f"{what} takes FieldRefs or key strings, got {type(r).__name__} {r!r:.60}")
        keys.append(check_name(r, f"{what}: key"))
    return keys


class TransferQueueClient:
    """Writes fields to StorageUnits and reads them back by FieldRef. Thread-safe.

    ``get_many`` results are read-only arrays (views of the unit's memory when it is in-process, of the
    received frames otherwise); pass ``copy=True`` for writable arrays. ``fast_writes=False`` writes every
    put the plain placed way (the fast cases store and answer the same; this is for comparing them).
    ``read_streams``: how many units one read asks at once (the rest wait their turn); ``None``:
    :func:`default_read_streams`.
    """

    def __init__(self, controller: Any, units: Mapping[str, StorageUnit], *, node_id: str | None = None,
                 on_full: str = "spill", full_wait_s: float = 30.0, owns_handles: bool = False,
                 spec: dict[str, Any] | None = None, fast_writes: bool = True,
                 read_streams: int | None = None) -> None:
        if read_streams is not None and (isinstance(read_streams, bool) or not isinstance(read_streams, int)
                                         or read_streams < 1):
            raise TransferQueueError(f"read_streams must be an integer >= 1 or None, got {read_streams!r}")
        self.read_streams = default_read_streams() if read_streams is None else read_streams
        self._controller = controller
        self._remote_controller = bool(getattr(controller, "remote", False))
        self._units = dict(units)
        self.node_id = node_id
        self._owns_handles = owns_handles
        self._spec = spec
        self._lock = threading.Lock()
        self._counters = ClientCounters()
        self._pool: ThreadPoolExecutor | None = None
        self._lanes: ThreadPoolExecutor | None = None  # read lanes: their own threads (see _read_units)
        self._closed = False
        # Keys: a random per-client prefix plus a counter; unique across clients and cheap per put.
        self._key_prefix = uuid.uuid4().hex[:16]
        self._key_seq = itertools.count()
        self._liveness = LivenessView(controller) if hasattr(controller, "unit_states") else None
        self._inproc = InProcess.for_client(controller, self._units, node_id)  # None: units not in this process
        if self._liveness is not None:
            for uid, unit in self._units.items():
                attach = getattr(unit, "attach_liveness", None)
                if attach is not None:
                    attach(self._liveness.checker(uid))
        self._placed = PlacedWrite(controller, self._units, node_id=node_id, on_full=on_full,
                                   full_wait_s=full_wait_s, count=self._bump)
        self._fast_write: FastWrite | None = None
        if fast_writes:
            self._fast_write = self._inproc or LeasedWrite.for_client(controller, self._units, node_id,
                                                                      self._liveness)

    @classmethod
    def connect(cls, spec: Mapping[str, Any], *, node_id: str | None = None,
                fast_writes: bool = True, read_streams: int | None = None) -> "TransferQueueClient":
        """A client in another process (a trainer reader, a Ray actor) from ``TransferQueue.client_spec()``."""
        from dressage.tq.client.spec import connect_spec  # ZMQ only when needed

        return connect_spec(cls, spec, node_id=node_id, fast_writes=fast_writes, read_streams=read_streams)

    # -- write ---------------------------------------------------------------------------------
    def put(self, field: str, array: np.ndarray, *, batch: str | None = None, key: str | None = None) -> FieldRef:
        """Store ``array`` and return its FieldRef once it is durable in the unit.

        On any failure nothing stays behind: the directory entry is dropped and the unit copy, if one was
        made, is queued for deletion.
        """
        return self.put_many([(field, array)], batch=batch, keys=None if key is None else [key])[0]

    def put_many(self, items: Sequence[tuple[str, np.ndarray]], *, batch: str | None = None,
                 keys: Sequence[str] | None = None) -> list[FieldRef]:
        """Store several ``(field, array)`` items of one step on one unit: place, unit write, commit (on a
        lease the placement overlaps the write and nobody waits for the commit). All or nothing: more
        items than one request may carry go as several puts, and those stored before one that failed are
        deleted again."""
        self._check_open()
        if keys is not None and not isinstance(keys, (list, tuple)):
            if isinstance(keys, (str, bytes, bytearray, memoryview)):
                raise TransferQueueError(f"put_many keys must be a list of key strings, got {type(keys).__name__} "
                                         f"{keys!r:.60}")
            try:
                keys = list(keys)
            except TypeError:
                raise TransferQueueError(f"put_many keys must be a list of key strings, got "
                                         f"{type(keys).__name__} {keys!r:.60}") from None
        limit = max_keys()
        if len(items) > limit:
            if keys is not None and len(keys) != len(items):
                raise TransferQueueError(f"put_many got {len(items)} items but {len(keys)} keys")
            refs: list[FieldRef] = []
            try:
                for at in range(0, len(items), limit):
                    refs.extend(self.put_many(items[at:at + limit], batch=batch,
                                              keys=None if keys is None else keys[at:at + limit]))
            except BaseException:
                if refs:
                    try:
                        self.delete(refs)
                    except Exception:  # the directory keeps the deletions queued for the janitor
                        pass
                raise
            return refs
        put = self._prepare(items, batch, keys)
        if put is None:
            return []
        fast = self._fast_write
        unit_id = fast.write(put) if fast is not None else None
        rides = unit_id is not None and fast.commit_rides  # type: ignore[union-attr]
        if unit_id is None:
            unit_id = self._placed.write(put)
        self._commit(put, unit_id, rides)
        with self._lock:
            self._counters.puts += len(put.arrays)
            self._counters.bytes_written += put.nbytes
        # The arrays were prepared (plain dtype, at least one axis): their metadata needs no re-check.
        return [FieldRef.of_stored(k, unit_id, f, dtype_name(a.dtype), a.shape, batch)
                for k, a, f in zip(put.keys, put.arrays, put.fields)]

    def _prepare(self, items: Sequence[tuple[str, np.ndarray]], batch: str | None,
                 keys: Sequence[str] | None) -> PendingPut | None:
        """The put checked and its arrays prepared, before anything is sent; None for no items."""
        if batch is not None:
            check_batch(batch)
        if not items:
            return None
        if keys is not None and len(keys) != len(items):
            raise TransferQueueError(f"put_many got {len(items)} items but {len(keys)} keys")
        fields, arrays, private = [], [], []
        for field, array in items:
            fields.append(check_name(field, "field"))
            data = prepare_array(array, copy=False)
            arrays.append(data)
            private.append(data is not array)
        names = [self._new_key() for _ in items] if keys is None else [check_name(k, "key") for k in keys]
        placing = [(k, a.nbytes, f) for k, a, f in zip(names, arrays, fields)]
        return PendingPut(names, fields, arrays, private, batch, placing)

    def _commit(self, put: PendingPut, unit_id: str, rides: bool) -> None:
        try:
            if self._remote_controller:
                # Durable in the unit is what put promises; the directory learns it without a round trip.
                soon = {"soon": True} if rides else {}  # a leased put's commit rides on the next placement
                self._controller.commit_many(put.keys, unit_id=unit_id, wait=False, **soon)
            else:
                self._controller.commit_many(put.keys, unit_id=unit_id)
        except BaseException:
            abort_quietly(self._controller, put.keys)
            raise

    def _new_key(self) -> str:
        return f"{self._key_prefix}-{next(self._key_seq):x}"

    def _bump(self, counter: str) -> None:
        with self._lock:
            setattr(self._counters, counter, getattr(self._counters, counter) + 1)

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
        if len(refs) == 1 and self._inproc is not None:
            arr = self._inproc.read(refs[0])
            if arr is not None:
                self._count_reads(refs=1, requests=1, rows=arr.shape[0], nbytes=arr.nbytes)
                if consume:
                    self._controller.mark_consumed({refs[0].key})
                return [_owned_copy(arr) if copy else arr]
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
            out.append(_owned_copy(arr) if copy else arr)
        rows = nbytes = 0
        for arrays in results.values():
            for a in arrays:
                rows += a.shape[0]
                nbytes += a.nbytes
        self._count_reads(refs=len(refs), requests=len(per_unit), rows=rows, nbytes=nbytes)
        if consume and refs:
            self._controller.mark_consumed({r.key for r in refs})
        return out

    def _count_reads(self, *, refs: int, requests: int, rows: int, nbytes: int) -> None:
        with self._lock:
            c = self._counters
            c.get_calls += 1
            c.refs_requested += refs
            c.get_requests += requests
            c.rows_read += rows
            c.bytes_read += nbytes

    def _read_units(self, per_unit: dict[str, list[tuple[str, int, int]]]) -> dict[str, list[np.ndarray]]:
        units = self._units
        # In-process units read through ``read_local``: the views stay in this process (verify_local_reads).
        readers = {uid: units[uid].get_many if units[uid].remote else units[uid].read_local for uid in per_unit}
        lanes = min(self.read_streams, sum(units[uid].remote for uid in per_unit))
        if lanes <= 1:
            return {uid: readers[uid](reqs) for uid, reqs in per_unit.items()}
        # Several remote units, ``read_streams`` at a time: each lane reads its units one after another,
        # the lanes side by side, so the slowest lane, not the sum, sets the latency.
        order = list(per_unit)

        def lane(uids: list[str]) -> dict[str, list[np.ndarray]]:
            return {uid: readers[uid](per_unit[uid]) for uid in uids}

        # On threads of their own: a get_many running on the client's pool (``aget_many``) must never wait
        # for a lane queued behind it there.
        pool = self._lane_pool()
        futures = [pool.submit(lane, order[i::lanes]) for i in range(1, lanes)]
        out = lane(order[::lanes])  # the first lane on this thread
        for fut in futures:
            out.update(fut.result())
        return out

    def get(self, ref: FieldRef, *, copy: bool = False) -> np.ndarray:
        return self.get_many([ref], copy=copy)[0]

    async def aget_many(self, refs: Sequence[FieldRef], *, copy: bool = False,
                        consume: bool = False) -> list[np.ndarray]:
        self._check_open()
        fut = self._executor().submit(self.get_many, refs, copy=copy, consume=consume)
        return await asyncio.wrap_future(fut)

    # -- lifecycle -----------------------------------------------------------------------------
    def delete(self, refs_or_keys: Iterable[FieldRef | str]) -> int:
        """Remove keys everywhere now; returns how many the directory knew. A unit that cannot be reached
        keeps its deletions queued in the directory (the janitor's) and is no error: those keys are gone
        from the directory already."""
        self._check_open()
        keys = list(dict.fromkeys(keys_of(refs_or_keys, "delete")))
        return self._drop(self._controller.delete(keys))

    def clear(self, batch: str) -> int:
        """Remove every key of a finished batch from every unit; returns the number of keys removed."""
        self._check_open()
        if batch is None:
            raise TransferQueueError("clear takes a batch name, got None")
        check_batch(batch, "clear batch")
        # A page of the batch at a time, so no request or answer carries more keys than one may. A unit
        # that cannot be reached keeps its deletions queued in the directory (``_drop``); a page whose unit
        # deletions fail otherwise stays queued too (the janitor retries it page by page): the other pages
        # are still cleared, then the first such failure is raised.
        removed, failed = 0, None
        while page := self._controller.clear(batch, limit=max_keys()):
            try:
                removed += self._drop(page)
            except Exception as exc:
                removed += sum(len(k) for k in page.values())
                failed = failed or exc
        if failed is not None:
            raise failed
        return removed

    def _drop(self, placement: dict[str, list[str]]) -> int:
        # The directory already forgot the keys and queued the unit deletions; deleting here makes the
        # call synchronous, and the directory is then told (one-way) to take them off its janitor's queue
        # (a janitor that took them first deletes them twice: idempotent, harmless). A unit that
        # cannot be reached now (dead, stalled, gone mid-call) keeps its deletions queued for the janitor:
        # nothing is left to do here, so that is counted (``deletes_deferred``), not raised.
        failed: list[BaseException] = []
        deferred = 0
        for unit_id, keys in placement.items():
            unit = self._units.get(unit_id)
            if unit is None:
                continue
            why = self._liveness.reason(unit_id) if self._liveness is not None and unit.remote else None
            if not why:
                try:
                    unit.delete(keys)
                except StorageUnitUnavailable as exc:
                    why = str(exc)
                except Exception as exc:  # the janitor retries; report after trying every unit
                    failed.append(exc)
                    continue
                else:
                    self._deleted(unit_id, keys)
                    continue
            deferred += len(keys)
            log.warning("%d deletions of StorageUnit %s stay queued for the janitor: %s", len(keys), unit_id, why)
        n = sum(len(k) for k in placement.values())
        with self._lock:
            self._counters.deletes += n
            self._counters.deletes_deferred += deferred
        if failed:
            raise failed[0]
        return n

    def _deleted(self, unit_id: str, keys: list[str]) -> None:
        """Tell the directory the unit copies are gone, so its janitor does not delete them a second time."""
        try:
            self._controller.deleted(unit_id, keys)
        except TransferQueueError as exc:  # its janitor deletes them again: idempotent, only work
            log.debug("could not tell the Controller of %d deletion(s) on %s: %s", len(keys), unit_id, exc)

    def mark_consumed(self, refs_or_keys: Iterable[FieldRef | str]) -> int:
        self._check_open()
        return self._controller.mark_consumed(set(keys_of(refs_or_keys, "mark_consumed")))

    def touch(self, refs_or_keys: Iterable[FieldRef | str]) -> int:
        """Renew keys this caller still holds: their retention counts from now, their state stays (see
        ``tq/client/renewal.py``). Returns how many the directory holds; a page of keys per request."""
        self._check_open()
        return self._controller.touch(list(dict.fromkeys(keys_of(refs_or_keys, "touch"))))

    def retention(self) -> float | None:
        """The TransferQueue's ``retention_s``: how long a key nobody writes, reads or renews is kept
        (None: kept until cleared)."""
        self._check_open()
        return self._controller.retention()

    def set_batch(self, refs_or_keys: Iterable[FieldRef | str], batch: str | None) -> int:
        """Move keys to another batch (e.g. once the rollout step that will consume them is known)."""
        self._check_open()
        keys = set(keys_of(refs_or_keys, "set_batch"))
        return self._controller.set_batch(keys, check_batch(batch, "set_batch batch"))

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
        return unit_of(self._units, unit_id)

    def _lane_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._lanes is None:
                self._lanes = ThreadPoolExecutor(max_workers=max(8, self.read_streams - 1),
                                                 thread_name_prefix="tq-read")
            return self._lanes

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
        for pool in (self._pool, self._lanes):
            if pool is not None:
                pool.shutdown(wait=True)
        if self._fast_write is not None:
            self._fast_write.close()
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
