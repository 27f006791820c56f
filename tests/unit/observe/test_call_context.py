"""W3C ``traceparent`` parsing and the JSON log lines that carry a call's ids."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

from dressage.errors import ConfigError
from dressage.observe import bind_call, configure_logging, current_call, parse_traceparent

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def test_a_valid_traceparent_is_kept_and_a_bad_one_starts_a_new_trace():
    assert parse_traceparent(f"00-{TRACE}-{PARENT}-01") == (TRACE, PARENT, "01")
    assert parse_traceparent(f"00-{TRACE.upper()}-{PARENT}-00") == (TRACE, PARENT, "00")
    for bad in (None, "", "garbage", f"ff-{TRACE}-{PARENT}-01", f"00-{'0' * 32}-{PARENT}-01",
                f"00-{TRACE}-{'0' * 16}-01", f"00-{TRACE[:-1]}-{PARENT}-01", f"00-{TRACE}-{PARENT}-01-extra"):
        assert parse_traceparent(bad) is None, bad
    # A later version may carry more fields after the four it shares with version 00.
    assert parse_traceparent(f"01-{TRACE}-{PARENT}-01-more") == (TRACE, PARENT, "01")

    async def call(header):
        ctx = bind_call(traceparent=header, session_id="s1")
        await asyncio.sleep(0)
        assert current_call() is ctx
        return ctx

    kept = asyncio.run(call(f"00-{TRACE}-{PARENT}-01"))
    assert (kept.trace_id, kept.parent_span_id, kept.session_id) == (TRACE, PARENT, "s1")
    child = kept.traceparent("a" * 16)
    assert child == f"00-{TRACE}-{'a' * 16}-01" and parse_traceparent(child) == (TRACE, "a" * 16, "01")
    fresh = asyncio.run(call("nonsense"))
    assert fresh.trace_id != TRACE and len(fresh.trace_id) == 32 and fresh.parent_span_id is None


def test_json_lines_carry_the_ids_of_the_call_being_served():
    out = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure_logging("json", level="INFO", process="proxy", stream=out)
    try:
        log = logging.getLogger("dressage.test")
        log.info("outside any call")

        async def call():
            bind_call(traceparent=f"00-{TRACE}-{PARENT}-01", session_id="sess-9")
            log.warning("inside %s", "a call")
            try:
                raise ValueError("boom")
            except ValueError:
                log.exception("failed")

        asyncio.run(call())
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["message"] for line in lines] == ["outside any call", "inside a call", "failed"]
    assert "trace_id" not in lines[0] and lines[0]["process"] == "proxy" and lines[0]["level"] == "info"
    for line in lines[1:]:
        assert (line["session_id"], line["trace_id"]) == ("sess-9", TRACE)
        assert line["call_id"] == line["span_id"] and len(line["call_id"]) == 16
    assert "ValueError: boom" in lines[2]["exception"]


def test_an_unknown_log_format_is_refused():
    with pytest.raises(ConfigError, match="log_format"):
        configure_logging("xml")
