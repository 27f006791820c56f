"""PutBatcher: one writer thread that merges the puts of concurrent callers into few ``put_many`` calls.

Each caller submits the fields of one step and gets a future of their FieldRefs. While a put is on the
wire, later submissions queue; the next round sends everything queued (per batch tag, up to a size
bound) as one ``put_many``: one placement, one unit round trip and one commit for many steps instead of
one each. The all-or-nothing rule holds per round and so per step: a round that fails fails every
future in it, and the client has then left nothing of any of them behind.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from dressage.errors import TransferQueueError

__all__ = ["PutBatcher"]

log = logging.getLogger(__name__)


class _Put:
    __slots__ = ("items", "keys", "batch", "future", "nbytes")

    def __init__(self, items: list[tuple[str, np.ndarray]], keys: list[str], batch: str | None) -> None:
        self.items, self.keys, self.batch = items, keys, batch
        self.future: Future = Future()
        self.nbytes = sum(int(a.nbytes) for _, a in items)


class PutBatcher:
    """Merges :meth:`submit` calls into ``client.put_many`` rounds on one daemon thread.

    ``max_items`` / ``max_bytes`` bound one round (a single larger put goes alone). Futures resolve on
    the writer thread, so their callbacks run there, one after the other, in submission order.
    """

    def __init__(self, client: Any, *, max_items: int = 256, max_bytes: int = 32 << 20,
                 name: str = "tq-put-batcher") -> None:
        if max_items < 1 or max_bytes < 1:
            raise TransferQueueError("PutBatcher needs max_items >= 1 and max_bytes >= 1")
        self.client = client
        self.max_items, self.max_bytes = int(max_items), int(max_bytes)
        self._queue: deque[_Put] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._busy = False
        self.rounds = 0
        self.steps = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, items: Sequence[tuple[str, np.ndarray]], *, keys: Sequence[str],
               batch: str | None = None) -> "Future[list[Any]]":
        """Queue one step's fields (``keys`` one per item); the future holds their FieldRefs, in order.

        The caller must not modify the arrays until the future resolves.
        """
        items, keys = list(items), list(keys)
        if not items or len(keys) != len(items):
            raise TransferQueueError(f"submit takes one key per item, got {len(items)} items, {len(keys)} keys")
        put = _Put(items, keys, batch)
        with self._cond:
            if self._closed:
                raise TransferQueueError("PutBatcher is closed")
            self._queue.append(put)
            self._cond.notify()
        return put.future

    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + (1 if self._busy else 0)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted put has resolved; False if ``timeout_s`` ran out first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout_s)

    def close(self, timeout_s: float | None = 30.0) -> None:
        """Send what is queued, then stop the thread (later submissions are refused)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    def _take(self) -> list[_Put] | None:
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            first = self._queue.popleft()
            round_, nbytes = [first], first.nbytes
            rest: deque[_Put] = deque()
            while self._queue and len(round_) < self.max_items:
                put = self._queue.popleft()
                if put.batch != first.batch or nbytes + put.nbytes > self.max_bytes:
                    rest.append(put)  # another batch tag, or too large for this round: the next one
                    continue
                round_.append(put)
                nbytes += put.nbytes
            self._queue.extendleft(reversed(rest))
            self._busy = True
            return round_

    def _run(self) -> None:
        while True:
            round_ = self._take()
            if round_ is None:
                return
            try:
                self._send(round_)
            finally:
                # Dropped before waiting for the next round: an idle writer holds no Step's arrays.
                round_ = None
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _send(self, round_: list[_Put]) -> None:
        items = [it for put in round_ for it in put.items]
        keys = [k for put in round_ for k in put.keys]
        try:
            refs = self.client.put_many(items, batch=round_[0].batch, keys=keys)
        except BaseException as exc:  # every step of the round failed, and none left anything behind
            for put in round_:
                _resolve(put.future, exc=exc)
            return
        self.rounds += 1
        self.steps += len(round_)
        at = 0
        for put in round_:
            n = len(put.items)
            _resolve(put.future, result=list(refs[at:at + n]))
            at += n


def _resolve(future: Future, *, result: Any = None, exc: BaseException | None = None) -> None:
    # A callback that raises must not stop the writer thread (Future logs and swallows it).
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except Exception:  # already resolved: nothing to do
        log.debug("put future was already resolved", exc_info=True)
