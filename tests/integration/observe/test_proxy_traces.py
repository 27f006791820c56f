"""An agent's W3C ``traceparent`` reaches the engine on ``/generate`` (same trace, a child span per engine
request); without one the engine still gets a trace of the call's own."""

from __future__ import annotations

import httpx

from dressage.observe import parse_traceparent
from dressage.proxy.engines.sglang_client import SGLangClient
from dressage.testing.stack import start_proxy

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


class Headers(httpx.AsyncBaseTransport):
    """Forwards to the engine and keeps each /generate request's traceparent."""

    def __init__(self):
        self.inner = httpx.AsyncHTTPTransport()
        self.seen = []

    async def handle_async_request(self, request):
        if request.url.path == "/generate":
            self.seen.append(request.headers.get("traceparent"))
        return await self.inner.handle_async_request(request)

    async def aclose(self):
        await self.inner.aclose()


def test_the_agents_traceparent_reaches_the_engine_as_a_child_span(engine):
    rec = Headers()
    with start_proxy(engine.url, engine=SGLangClient(engine.url, timeout=20, transport=rec)) as proxy:
        body = {"messages": [{"role": "user", "content": "trace me"}], "max_tokens": 4}
        r = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=30,
                       headers={"X-Session-Id": "t-1", "traceparent": f"00-{TRACE}-{PARENT}-01"})
        assert r.status_code == 200, r.text
        r = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=30, headers={"X-Session-Id": "t-2"})
        assert r.status_code == 200, r.text
    assert len(rec.seen) == 2
    traced = parse_traceparent(rec.seen[0])
    assert traced is not None and traced[0] == TRACE and traced[1] != PARENT and traced[2] == "01"
    own = parse_traceparent(rec.seen[1])
    assert own is not None and own[0] != TRACE


def test_json_log_lines_of_a_call_carry_its_session_and_trace(engine, proxy_stack):
    import io
    import json
    import logging

    from dressage.observe import configure_logging

    out = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure_logging("json", level="INFO", process="proxy", stream=out)
    try:
        proxy = proxy_stack(engine.url, log_format="json")
        r = httpx.post(proxy.url + "/v1/chat/completions", timeout=30,
                       json={"messages": [{"role": "user", "content": "log me"}], "max_tokens": 4},
                       headers={"X-Session-Id": "log-1", "traceparent": f"00-{TRACE}-{PARENT}-01"})
        assert r.status_code == 200, r.text
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    calls = [line for line in lines if line["message"].startswith("model call POST /v1/chat/completions")]
    assert len(calls) == 1, lines
    assert (calls[0]["session_id"], calls[0]["trace_id"], calls[0]["process"]) == ("log-1", TRACE, "proxy")
    assert len(calls[0]["call_id"]) == 16


def test_exported_spans_are_one_per_call_with_engine_write_and_commit_children(engine):
    import time

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from dressage.observe.otel import CallTracing
    from dressage.tq import TransferQueue

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    rec = Headers()
    tq = TransferQueue.start({"deployment": "embedded", "num_storage_units": 1, "retention_s": None})
    try:
        with start_proxy(engine.url, tq=tq, engine=SGLangClient(engine.url, timeout=20, transport=rec)) as proxy:
            proxy.service.tracing = CallTracing(provider)
            r = httpx.post(proxy.url + "/v1/chat/completions", timeout=30,
                           json={"messages": [{"role": "user", "content": "span me"}], "max_tokens": 4},
                           headers={"X-Session-Id": "o-1", "traceparent": f"00-{TRACE}-{PARENT}-01"})
            assert r.status_code == 200, r.text
            deadline = time.monotonic() + 10
            while len(spans.get_finished_spans()) < 4 and time.monotonic() < deadline:
                time.sleep(0.02)  # the write and commit spans end behind the answer
    finally:
        tq.shutdown()
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert sorted(by_name) == ["POST /v1/chat/completions", "commit", "engine /generate", "tq.write"]
    call = by_name.pop("POST /v1/chat/completions")
    assert f"{call.context.trace_id:032x}" == TRACE and f"{call.parent.span_id:016x}" == PARENT
    assert call.attributes["session_id"] == "o-1"
    for child in by_name.values():
        assert child.context.trace_id == call.context.trace_id and child.parent.span_id == call.context.span_id
    engine_span = by_name["engine /generate"]
    assert rec.seen == [f"00-{TRACE}-{engine_span.context.span_id:016x}-01"]
    assert by_name["tq.write"].end_time <= by_name["commit"].start_time
