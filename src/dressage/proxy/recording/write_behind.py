"""How a step's offloaded fields reach TransferQueue before its commit: behind the answer, or before it.

``ProxyCore.begin_step`` validates a step at once (every error is raised there, nothing written) and
hands its offloaded fields and its commit to :class:`WriteBehind`. On (the default), the fields go to a
:class:`dressage.tq.client.batching.PutBatcher` and the call gets a :class:`PendingStep` at once: the
validated record (what the answer reports) and a future that resolves once the keys are committed and
the step is in the session. Until then the step is invisible: the session's next call waits for it
before it is routed (:meth:`WriteBehind.settled`), and so does finalize. A write that fails records
nothing; it is counted and logged, and the session goes on from its last recorded step. Off, the write
and the commit run before :meth:`WriteBehind.submit` returns, and their errors are raised there.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

from dressage.errors import DressageError, TransferWriteError
from dressage.observe.context import current_call
from dressage.tq.client.batching import PutBatcher
from dressage.trajectory import StepRecord

__all__ = ["PendingStep", "WriteBehind", "done_step"]

log = logging.getLogger(__name__)

Commit = Callable[[dict[str, Any]], StepRecord]
"""Records a step once its fields are stored, given ``{field: FieldRef}``; deletes those keys itself
if it cannot."""


@dataclass(slots=True)
class PendingStep:
    """A validated step whose commit may still be under way."""

    preview: StepRecord
    """The record as validated when the call ended (its step id may change if a concurrent call of
    the same session commits first); what an answer reports about token counts."""
    future: "Future[StepRecord]"
    """Resolves to the committed record, or to the error that kept the step out."""

    def result(self, timeout_s: float | None = None) -> StepRecord:
        return self.future.result(timeout_s)


def done_step(step: StepRecord) -> PendingStep:
    """A step already committed, as a :class:`PendingStep`."""
    fut: Future = Future()
    fut.set_result(step)
    return PendingStep(step, fut)


def _write_failed(session_id: str, exc: BaseException) -> BaseException:
    """A failed write as the caller sees it: the client's own errors become :class:`TransferWriteError`
    (the client leaves nothing of a failed put behind, so nothing of the step was stored)."""
    if not isinstance(exc, DressageError) or isinstance(exc, TransferWriteError):
        return exc
    error = TransferWriteError(f"session {session_id}: TransferQueue write failed: {exc}")
    error.__cause__ = exc
    return error


class WriteBehind:
    """The TransferQueue writes of one ProxyCore's steps, and the commits still under way per session.

    ``enabled``: whether :meth:`submit` returns before the write lands; it is off without a client.
    ``batcher`` options go to the :class:`PutBatcher`, started on the first write behind an answer.
    """

    def __init__(self, tq: Any, *, enabled: bool = True, **batcher: Any) -> None:
        self.tq = tq
        self.enabled = bool(enabled) and tq is not None
        self.batcher: PutBatcher | None = None
        self._batcher_options = batcher
        self._pending: dict[str, set[Future]] = {}
        self._lock = threading.Lock()
        self.failures = 0
        """Steps whose write failed after their call had answered (nothing of them was recorded)."""
        self.committed = 0
        """Steps committed behind their answer."""
        self.observe: Callable[[float, float], None] | None = None
        """Told ``(write_s, commit_s)`` of each step: its TQ write (from submit, batching included) and its
        local commit (the Proxy's metrics)."""

    def submit(self, session_id: str, preview: StepRecord, items: list[tuple[str, Any]], keys: list[str],
               batch: str | None, commit: Commit) -> PendingStep:
        """Write one step's fields (``keys`` one per item), then ``commit({field: ref})`` records it.

        On, the write is queued and this returns at once; the step's future holds the committed record
        or the error that kept it out. Off, the write and the commit are done when this returns (or
        have raised, leaving nothing recorded).
        """
        if not self.enabled:
            try:
                refs = self.tq.put_many(items, batch=batch, keys=keys)
            except BaseException as exc:
                raise _write_failed(session_id, exc)
            return done_step(commit(dict(zip((n for n, _ in items), refs))))
        names = [n for n, _ in items]
        done: Future = Future()
        began = time.perf_counter()
        call = current_call()
        traced = call is not None and call.span is not None
        began_ns = time.time_ns() if traced else 0

        def land(put: Future) -> None:
            try:
                refs = dict(zip(names, put.result()))
            except BaseException as exc:  # noqa: BLE001 - reported through the step's future
                done.set_exception(_write_failed(session_id, exc))
                return
            landed = time.perf_counter()
            landed_ns = time.time_ns() if traced else 0
            try:
                done.set_result(commit(refs))
            except BaseException as exc:  # noqa: BLE001 - the commit deleted its keys already
                done.set_exception(exc)
                return
            if self.observe is not None:
                self.observe(landed - began, time.perf_counter() - landed)
            if traced:  # the call's spans of the work behind its answer, at the times it was measured
                call.tracing.record(call, "tq.write", began_ns, landed_ns, keys=len(keys))
                call.tracing.record(call, "commit", landed_ns, time.time_ns(), session_id=session_id)

        put = self._batcher().submit(items, keys=keys, batch=batch)  # raises (nothing queued) when closed
        self._track(session_id, done)
        put.add_done_callback(land)
        return PendingStep(preview, done)

    def _batcher(self) -> PutBatcher:
        with self._lock:
            if self.batcher is None:
                self.batcher = PutBatcher(self.tq, **self._batcher_options)
            return self.batcher

    def _track(self, session_id: str, future: Future) -> None:
        with self._lock:
            self._pending.setdefault(session_id, set()).add(future)
        future.add_done_callback(lambda f: self._done(session_id, f))

    def _done(self, session_id: str, future: Future) -> None:
        with self._lock:
            left = self._pending.get(session_id)
            if left is not None:
                left.discard(future)
                if not left:
                    del self._pending[session_id]
            if future.exception() is None:
                self.committed += 1
            else:
                self.failures += 1
        exc = future.exception()
        if exc is not None:
            log.warning("session %s: a step was not recorded: %s", session_id, exc)

    def futures(self, session_id: str) -> list[Future]:
        with self._lock:
            return list(self._pending.get(session_id, ()))

    def pending(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._pending.values())

    def wait(self, session_id: str, timeout_s: float | None = None) -> None:
        """Block until the session's steps under way have committed or failed (failures are not raised)."""
        for fut in self.futures(session_id):
            try:
                fut.result(timeout_s)
            except Exception:  # noqa: BLE001 - a failed step is already counted and logged
                pass

    async def settled(self, session_id: str) -> None:
        """Await the session's steps under way without blocking the loop (the next call routes
        against what they recorded)."""
        futures = self.futures(session_id)
        if futures:
            await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)

    def close(self) -> None:
        """Send and commit what is queued, then stop the writer thread."""
        with self._lock:
            batcher = self.batcher
        if batcher is not None:
            batcher.close()
