"""``Server-Timing`` of a buffered answer: how long this request waited on the engine.

A client that knows its own latency for a call can then tell the Proxy's share of it from the
engine's (``latency - engine``), under any load, without a second run to compare with. The wait is
the time during which at least one of the request's engine calls was outstanding: a generation
resumed after a pause makes two calls one after the other, ``n > 1`` makes several at once, and
overlapping waits count once. Streamed answers carry no such header: their headers leave before the
engine is done.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

from dressage.observe.context import engine_request

__all__ = ["Tally", "current", "engine_wait", "header_value", "start"]

class Tally:
    """The engine wait of one request: ``seconds`` so far, the engine ``calls`` made, and those outstanding now."""

    __slots__ = ("seconds", "calls", "_open", "_since")

    def __init__(self) -> None:
        self.seconds, self.calls, self._open, self._since = 0.0, 0, 0, 0.0

    def enter(self) -> None:
        self.calls += 1
        if self._open == 0:
            self._since = time.perf_counter()
        self._open += 1

    def leave(self) -> None:
        self._open -= 1
        if self._open == 0:
            self.seconds += time.perf_counter() - self._since


_tally: ContextVar[Tally | None] = ContextVar("dressage_engine_wait", default=None)


def start() -> Tally:
    """A fresh tally for the request the calling task serves (tasks it starts share it)."""
    tally = Tally()
    _tally.set(tally)
    return tally


def current() -> Tally:
    """The tally of the request the calling task serves; a fresh one when none was started."""
    tally = _tally.get()
    return start() if tally is None else tally


class engine_wait:
    """``with engine_wait(): await engine_call`` counts the time inside as the request's engine wait, and
    is the engine request's span when spans are exported (:class:`dressage.observe.context.engine_request`)."""

    __slots__ = ("_tally", "_span")

    def __enter__(self) -> None:
        self._tally = _tally.get()
        if self._tally is not None:
            self._tally.enter()
        self._span = engine_request()
        self._span.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._span.__exit__(*exc)
        if self._tally is not None:
            self._tally.leave()


def header_value(tally: Tally) -> str:
    return f"engine;dur={tally.seconds * 1000.0:.3f}"
