"""PutBatcher: one writer thread that merges the puts of concurrent callers into few ``put_many`` calls.

Each caller submits the fields of one step and gets a future of their FieldRefs. While the rounds in
flight fill every sender, later submissions queue; the next round sends everything queued (per batch
tag, up to a size bound) as one ``put_many``: one placement, one unit round trip and one commit for many
steps instead of one each. Two rounds are in flight by default, so one round's bytes are on the link
while the other waits for its unit's reply, its commit or a placement lease. Rounds resolve in the
order they were formed. The all-or-nothing rule holds per round and so per step: a round that fails
fails every future in it, and the client has then left nothing of any of them behind.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
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


class _Round:
    """One ``put_many`` formed from queued puts, and its outcome once it has one."""

    __slots__ = ("puts", "refs", "error", "done")

    def __init__(self, puts: list[_Put]) -> None:
        self.puts = puts
        self.refs: list[Any] | None = None
        self.error: BaseException | None = None
        self.done = False


class PutBatcher:
    """Merges :meth:`submit` calls into ``client.put_many`` rounds, formed on one daemon thread.

    ``max_items`` / ``max_bytes`` bound one round (a single larger put goes alone).
    ``rounds_in_flight``: how many rounds are sent at once, each from a daemon sender thread of its own
    (the client is thread-safe). Rounds resolve in the order they were formed, whichever finishes first, so
    the futures' callbacks run one after the other, in submission order (on the sender thread that
    finished the oldest round still open).
    """

    def __init__(self, client: Any, *, max_items: int = 256, max_bytes: int = 32 << 20,
                 rounds_in_flight: int = 2, name: str = "tq-put-batcher") -> None:
        if max_items < 1 or max_bytes < 1 or rounds_in_flight < 1:
            raise TransferQueueError("PutBatcher needs max_items, max_bytes and rounds_in_flight >= 1")
        self.client = client
        self.max_items, self.max_bytes = int(max_items), int(max_bytes)
        self.rounds_in_flight = int(rounds_in_flight)
        self._queue: deque[_Put] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._in_flight = 0
        self._open: deque[_Round] = deque()  # rounds sent and not yet resolved, oldest first
        self._resolving = threading.Lock()
        self._formed: queue.SimpleQueue[_Round | None] = queue.SimpleQueue()  # to the senders; None: stop
        self.rounds = 0
        self.steps = 0
        self._threads = [threading.Thread(target=self._form, name=name, daemon=True)]
        self._threads += [threading.Thread(target=self._sender, name=f"{name}-send-{i}", daemon=True)
                          for i in range(self.rounds_in_flight)]
        for thread in self._threads:
            thread.start()

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
            return len(self._queue) + self._in_flight

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted put has resolved; False if ``timeout_s`` ran out first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._in_flight, timeout_s)

    def close(self, timeout_s: float | None = 30.0) -> None:
        """Send what is queued, wait for the rounds in flight, then stop (later submissions are refused)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _take(self) -> _Round | None:
        with self._cond:
            while not self._queue or self._in_flight >= self.rounds_in_flight:
                if self._closed and not self._queue:
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
            self._in_flight += 1
            taken = _Round(round_)
        with self._resolving:
            self._open.append(taken)
        return taken

    def _form(self) -> None:
        try:
            while True:
                round_ = self._take()
                if round_ is None:
                    return
                self._formed.put(round_)
                # Dropped before waiting for the next round: an idle writer holds no Step's arrays.
                round_ = None
        finally:
            for _ in range(self.rounds_in_flight):
                self._formed.put(None)

    def _sender(self) -> None:
        while True:
            round_ = self._formed.get()
            if round_ is None:
                return
            self._send(round_)
            round_ = None

    def _send(self, round_: _Round) -> None:
        items = [it for put in round_.puts for it in put.items]
        keys = [k for put in round_.puts for k in put.keys]
        try:
            round_.refs = self.client.put_many(items, batch=round_.puts[0].batch, keys=keys)
        except BaseException as exc:  # every step of the round failed, and none left anything behind
            round_.error = exc
        del items, keys
        self._settle(round_)

    def _settle(self, finished: _Round) -> None:
        """Resolve, oldest first, every round whose outcome is in, up to the first still on the wire."""
        with self._resolving:
            finished.done = True
            while self._open and self._open[0].done:
                round_ = self._open.popleft()
                self._resolve_round(round_)
                round_.puts, round_.refs = [], None  # the steps' arrays go with their futures
                with self._cond:
                    self._in_flight -= 1
                    self._cond.notify_all()

    def _resolve_round(self, round_: _Round) -> None:
        if round_.error is not None:
            for put in round_.puts:
                _resolve(put.future, exc=round_.error)
            return
        self.rounds += 1
        self.steps += len(round_.puts)
        at = 0
        for put in round_.puts:
            n = len(put.items)
            _resolve(put.future, result=list(round_.refs[at:at + n]))  # type: ignore[index]
            at += n


def _resolve(future: Future, *, result: Any = None, exc: BaseException | None = None) -> None:
    # A callback that raises must not stop a sender thread (Future logs and swallows it).
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except Exception:  # already resolved: nothing to do
        log.debug("put future was already resolved", exc_info=True)
