"""Optional OpenTelemetry export: one span per agent call, with child spans for each engine request,
the step's TransferQueue write and its local commit.

Only used when ``opentelemetry-sdk`` is installed (``pip install 'dressage[otel]'``) and an exporter is
chosen (``--otel-exporter console|otlp``). The call span continues the agent's ``traceparent``; its ids
become the call context's (:mod:`dressage.observe.context`), so log lines and the engine's
``traceparent`` name the spans that were exported. Spans of work done behind the answer (the TQ write,
the commit) are recorded with the times they were measured at, under the call's span.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

from dressage.errors import ConfigError
from dressage.observe.context import CallContext

__all__ = ["OTEL_EXPORTERS", "CallTracing", "call_tracing"]

OTEL_EXPORTERS = ("none", "console", "otlp")


class CallTracing:
    """Spans of calls, over an OpenTelemetry ``TracerProvider`` (the caller's, or one :func:`call_tracing` made)."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.provider = provider
        self.tracer = provider.get_tracer("dressage")

    def start_call(self, ctx: CallContext, name: str, **attributes: Any) -> Any:
        """Start the call's span (a child of the agent's span when it sent one); the context takes its ids."""
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        parent = None
        if ctx.parent_span_id is not None:
            remote = SpanContext(trace_id=int(ctx.trace_id, 16), span_id=int(ctx.parent_span_id, 16), is_remote=True,
                                 trace_flags=TraceFlags(int(ctx.flags, 16)))
            parent = self._trace.set_span_in_context(NonRecordingSpan(remote))
        span = self.tracer.start_span(name, context=parent, kind=self._trace.SpanKind.SERVER,
                                      attributes={k: v for k, v in attributes.items() if v is not None})
        own = span.get_span_context()
        ctx.trace_id, ctx.span_id = f"{own.trace_id:032x}", f"{own.span_id:016x}"
        ctx.flags = f"{int(own.trace_flags):02x}"
        ctx.span, ctx.tracing = span, self
        return span

    def _under(self, ctx: CallContext) -> Any:
        return self._trace.set_span_in_context(ctx.span)

    @contextmanager
    def child(self, ctx: CallContext, name: str, **attributes: Any) -> Iterator[Any]:
        """A child span of the call around the ``with`` block (an engine request)."""
        span = self.tracer.start_span(name, context=self._under(ctx), kind=self._trace.SpanKind.CLIENT,
                                      attributes=attributes)
        try:
            yield span
        finally:
            span.end()

    def record(self, ctx: CallContext, name: str, start_ns: int, end_ns: int, **attributes: Any) -> None:
        """A child span of the call for work measured elsewhere (another thread, after the answer)."""
        span = self.tracer.start_span(name, context=self._under(ctx), start_time=start_ns, attributes=attributes)
        span.end(end_time=end_ns)

    def end_call(self, ctx: CallContext, *, error: bool = False) -> None:
        if ctx.span is not None:
            if error:
                from opentelemetry.trace import Status, StatusCode

                ctx.span.set_status(Status(StatusCode.ERROR))
            ctx.span.end()

    def close(self) -> None:
        shutdown = getattr(self.provider, "shutdown", None)
        if shutdown is not None:
            shutdown()


def call_tracing(exporter: str, *, service_name: str = "dressage-proxy") -> CallTracing | None:
    """The tracing of ``exporter`` (``none``: ``None``). ``otlp`` reads the standard ``OTEL_EXPORTER_OTLP_*``
    variables (endpoint, headers); a missing package is a ConfigError naming what to install."""
    if exporter not in OTEL_EXPORTERS:
        raise ConfigError(f"otel_exporter: expected one of {', '.join(OTEL_EXPORTERS)}, got {exporter!r}")
    if exporter == "none":
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        raise ConfigError("otel_exporter: OpenTelemetry export needs opentelemetry-sdk: "
                          "pip install 'dressage[otel]'") from None
    if exporter == "console":
        span_exporter: Any = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ConfigError("otel_exporter: otlp needs opentelemetry-exporter-otlp-proto-http: "
                              "pip install 'dressage[otel]'") from None
        span_exporter = OTLPSpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    return CallTracing(provider)


def now_ns() -> int:
    return time.time_ns()
