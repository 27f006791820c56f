"""Write-behind for the commit region: a call's answer does not wait for its TransferQueue write.

``ProxyCore.begin_step`` validates and encodes a step at once (every error is raised there, nothing
written), hands its offloaded fields to a :class:`dressage.tq.client.batching.PutBatcher` and returns a
:class:`PendingStep`: the validated record (what the answer reports) and a future that resolves once
the keys are committed and the step is in the session. Until then the step is invisible: the
session's next call waits for it before it is routed (:meth:`WriteBehind.settled`), and so does
finalize. A write that fails records nothing, exactly as a synchronous one; it is counted and logged,
and the session goes on from its last recorded step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

from dressage.errors import DressageError, TransferWriteError
from dressage.tq.client.batching import PutBatcher
from dressage.trajectory import StepRecord

__all__ = ["PendingStep", "WriteBehind", "WriteBehindCore"]

log = logging.getLogger(__name__)


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
    fut: Future = Future()
    fut.set_result(step)
    return PendingStep(step, fut)


class WriteBehind:
    """The commits of one ProxyCore still under way, per session, and the batcher they go through."""

    def __init__(self, tq: Any, **batcher: Any) -> None:
        self.batcher = PutBatcher(tq, **batcher)
        self._pending: dict[str, set[Future]] = {}
        self._lock = threading.Lock()
        self.failures = 0
        """Steps whose write failed after their call had answered (nothing of them was recorded)."""
        self.committed = 0

    def submit(self, session_id: str, items: list[tuple[str, Any]], keys: list[str], batch: str | None,
               commit: Callable[[dict[str, Any]], StepRecord]) -> "Future[StepRecord]":
        """Queue one step's write; once it lands, ``commit({field: ref})`` records the step (and
        deletes the keys itself if it cannot). The returned future holds the committed record."""
        names = [n for n, _ in items]
        done: Future = Future()

        def land(put: Future) -> None:
            try:
                refs = dict(zip(names, put.result()))
            except BaseException as exc:  # noqa: BLE001 - reported through the step's future
                error = exc
                if isinstance(exc, DressageError) and not isinstance(exc, TransferWriteError):
                    error = TransferWriteError(f"session {session_id}: TransferQueue write failed: {exc}")
                done.set_exception(error)
                return
            try:
                done.set_result(commit(refs))
            except BaseException as exc:  # noqa: BLE001 - the commit deleted its keys already
                done.set_exception(exc)

        put = self.batcher.submit(items, keys=keys, batch=batch)  # raises (nothing queued) when closed
        self.track(session_id, done)
        put.add_done_callback(land)
        return done

    def track(self, session_id: str, future: Future) -> None:
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
        """Await the session's steps under way (the next call routes against what they recorded)."""
        futures = self.futures(session_id)
        if futures:
            await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)

    def close(self) -> None:
        """Send and commit what is queued, then stop the writer thread."""
        self.batcher.close()


class WriteBehindCore:
    """The write-behind side of :class:`dressage.proxy.recording.core.ProxyCore` (its ``tq``, ``config``,
    ``write_behind``, ``_behind`` and ``_lock``): the batcher, made on first use, and the waits on it."""

    tq: Any
    config: Any
    write_behind: bool
    _behind: WriteBehind | None
    _lock: Any

    @property
    def writes_behind(self) -> bool:
        """Whether :meth:`begin_step` returns before the step's TQ write (offloaded fields, write-behind on)."""
        return self.write_behind and self.tq is not None and bool(self.config.offloaded)

    def _write_behind(self) -> WriteBehind:
        with self._lock:
            if self._behind is None:
                self._behind = WriteBehind(self.tq)
            return self._behind

    async def settled(self, session_id: str) -> None:
        """Wait (without blocking the loop) for the session's steps still being written."""
        if self._behind is not None:
            await self._behind.settled(session_id)

    def _settle(self, session_id: str) -> None:
        if self._behind is not None:
            self._behind.wait(session_id)

    def close(self) -> None:
        """Write and commit every step still under way (the Proxy calls this when it stops)."""
        if self._behind is not None:
            self._behind.close()
