"""The context of one agent call: its session, its call id and its W3C trace context.

The Proxy binds it once per request (:func:`bind_call`); log lines (:mod:`dressage.observe.logs`) and
the engine client (the ``traceparent`` it sends on ``/generate``) read it from a context variable, so
nothing threads it through the call path's signatures. A ``traceparent`` an agent sent is kept (its
trace id, its flags); without one a new trace starts. The engine request is a child span of the call.
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

__all__ = ["CallContext", "bind_call", "current_call", "parse_traceparent", "new_span_id", "engine_request",
           "engine_span_id"]

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-.*)?")


def new_span_id() -> str:
    return os.urandom(8).hex()


def parse_traceparent(value: str | None) -> tuple[str, str, str] | None:
    """``(trace_id, parent_span_id, flags)`` of a W3C ``traceparent`` header, or ``None`` when it is absent
    or not valid (version ``ff``, all-zero ids, wrong lengths): such a header is ignored, as the
    recommendation says, and the call starts a trace of its own."""
    if not value:
        return None
    m = _TRACEPARENT.fullmatch(value.strip().lower())
    if m is None:
        return None
    version, trace_id, parent, flags = m.groups()
    if version == "ff" or (version == "00" and len(value.strip()) != 55):
        return None
    if trace_id == "0" * 32 or parent == "0" * 16:
        return None
    return trace_id, parent, flags


@dataclass(slots=True)
class CallContext:
    """One call's ids. ``span_id`` is the Proxy's span for the call; ``parent_span_id`` the agent's."""

    call_id: str
    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    flags: str = "01"
    session_id: str | None = None
    span: Any = None
    """The call's OpenTelemetry span when spans are exported (:mod:`dressage.observe.otel`), else ``None``."""
    tracing: Any = None
    """The :class:`~dressage.observe.otel.CallTracing` that made ``span``."""

    def traceparent(self, span_id: str | None = None) -> str:
        """The ``traceparent`` of a child request: this trace, ``span_id`` (the call's span by default)."""
        return f"00-{self.trace_id}-{span_id or self.span_id}-{self.flags}"


_current: ContextVar[CallContext | None] = ContextVar("dressage_call", default=None)
_engine_span: ContextVar[str | None] = ContextVar("dressage_engine_span", default=None)


def engine_span_id() -> str:
    """The span id an engine request's ``traceparent`` names: its exported span's, else a fresh one."""
    return _engine_span.get() or new_span_id()


class engine_request:
    """``with engine_request(): await engine_call``: an exported child span of the call around the request
    (when the call has one), whose id the request's ``traceparent`` carries. Nothing when spans are off."""

    __slots__ = ("_cm", "_before")

    def __enter__(self) -> None:
        ctx = _current.get()
        self._cm = None
        if ctx is not None and ctx.span is not None:
            self._cm = ctx.tracing.child(ctx, "engine /generate")
            span = self._cm.__enter__()
            self._before = _engine_span.get()
            _engine_span.set(f"{span.get_span_context().span_id:016x}")

    def __exit__(self, *exc: Any) -> None:
        if self._cm is not None:
            # set, not reset: a streamed request's block may end in another context than it began in
            _engine_span.set(self._before)
            self._cm.__exit__(*exc)


def bind_call(*, traceparent: str | None = None, session_id: str | None = None) -> CallContext:
    """Start the context of the call the calling task serves (the tasks it starts share it)."""
    span = new_span_id()
    parsed = parse_traceparent(traceparent)
    if parsed is None:
        ctx = CallContext(call_id=span, trace_id=os.urandom(16).hex(), span_id=span, session_id=session_id)
    else:
        ctx = CallContext(call_id=span, trace_id=parsed[0], span_id=span, parent_span_id=parsed[1],
                          flags=parsed[2], session_id=session_id)
    _current.set(ctx)
    return ctx


def current_call() -> CallContext | None:
    """The context of the call the calling task serves, if one was bound."""
    return _current.get()
