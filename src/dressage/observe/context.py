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

__all__ = ["CallContext", "bind_call", "current_call", "parse_traceparent", "new_span_id"]

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

    def traceparent(self, span_id: str | None = None) -> str:
        """The ``traceparent`` of a child request: this trace, ``span_id`` (the call's span by default)."""
        return f"00-{self.trace_id}-{span_id or self.span_id}-{self.flags}"


_current: ContextVar[CallContext | None] = ContextVar("dressage_call", default=None)


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
