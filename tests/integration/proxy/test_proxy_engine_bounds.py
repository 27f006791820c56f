"""Every engine answer is bounded: one that declares more than the cap, sends more, or streams a line
longer than it is a typed 502 with at most the cap held; a streamed call that only gets keep-alives
is cut by the request timeout. Over both engine transports, and through the Proxy."""

from __future__ import annotations

import asyncio
import resource

import httpx
import pytest

from dressage.errors import EngineAnswerTooLargeError, EngineTimeout
from dressage.fields.r3_stream import RoutedExpertsSpec
from dressage.proxy.engines.aio_transport import AiohttpTransport
from dressage.proxy.engines.sglang_client import SGLangClient
from dressage.testing.stack import start_proxy
from dressage_bench.faults.hostile import HUGE_BYTES

CAP = 4 * 1024 * 1024
MSG = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}



def _transport(name: str):
    return AiohttpTransport() if name == "aiohttp" else httpx.AsyncHTTPTransport()


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


async def _call(url: str, transport: str, mode: str, *, stream: bool, timeout: float = 30.0, r3: bool = False):
    client = SGLangClient(url, timeout=timeout, transport=_transport(transport), max_answer_bytes=CAP)
    # With R3 the body is fed piece by piece to the routing decoder instead of read whole: the same cap.
    kw = {"return_routed_experts": True, "routed_experts_spec": RoutedExpertsSpec(4, 2, "uint8", 200)} if r3 else {}
    try:
        if stream:
            return [chunk async for chunk in client.generate_stream([1, 2], {"mode": mode}, **kw)]
        return await client.generate([1, 2], {"mode": mode}, **kw)
    finally:
        await client.close()


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
@pytest.mark.parametrize("mode, stream, r3", [("huge_declared", False, False), ("huge_chunked", False, False),
                                              ("huge_declared", False, True), ("huge_chunked", False, True),
                                              ("stream_huge_line", True, False)])
def test_an_answer_over_the_cap_is_refused_holding_at_most_the_cap(hostile, transport, mode, stream, r3):
    hostile.mode = mode
    before = _rss_mib()
    with pytest.raises(EngineAnswerTooLargeError) as err:
        asyncio.run(asyncio.wait_for(_call(hostile.url, transport, mode, stream=stream, r3=r3), 60))
    grown = _rss_mib() - before
    assert err.value.http_status == 502 and err.value.code == "engine_answer_too_large"
    assert str(CAP) in str(err.value)
    # The engine declares or would send 2 GiB; the reader held at most the cap (4 MiB) of it.
    assert grown < 64, f"RSS grew by {grown:.0f} MiB reading a {HUGE_BYTES >> 20} MiB answer"


def test_a_declared_size_over_the_cap_is_refused_before_its_body_is_read(hostile):
    hostile.mode = "huge_declared"

    async def go():
        client = SGLangClient(hostile.url, timeout=30, max_answer_bytes=CAP)
        resp = await client._send("POST", "/generate", json_body={"input_ids": [1]}, timeout=30, headers=None)
        try:
            assert resp.declared_size() == HUGE_BYTES
            with pytest.raises(Exception) as err:
                await resp.read(CAP)
            return err.value
        finally:
            await resp.aclose()
            await client.close()

    err = asyncio.run(go())
    assert type(err).__name__ == "EngineAnswerTooLarge" and f"declares {HUGE_BYTES} bytes" in str(err)


def test_the_cap_is_a_proxy_setting_and_must_be_positive():
    from dressage.errors import ConfigError
    from dressage.proxy.config import EnginesConfig

    assert EnginesConfig().max_answer_bytes == 256 * 1024 * 1024
    with pytest.raises(ConfigError, match="engines.max_answer_bytes"):
        EnginesConfig(max_answer_bytes=0)
    with pytest.raises(ConfigError, match="engines.max_answer_bytes"):
        EnginesConfig(max_answer_bytes=True)


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_keepalives_do_not_extend_a_streamed_call_past_its_timeout(hostile, transport):
    hostile.mode = "stream_keepalive"  # a keep-alive line every 50 ms, never a chunk
    with pytest.raises(EngineTimeout) as err:
        # The per-read timeout (0.5 s) is never reached between keep-alives; only the whole-call
        # deadline ends the call. The outer bound only keeps a regression from hanging the suite.
        asyncio.run(asyncio.wait_for(_call(hostile.url, transport, "stream_keepalive", stream=True, timeout=0.5),
                                     60))
    assert err.value.http_status == 504


def test_through_the_proxy_each_unbounded_answer_is_a_typed_error_and_records_nothing(hostile):
    engine = SGLangClient(hostile.url, timeout=1.0, max_answer_bytes=CAP)
    with start_proxy(hostile.url, r3=False, request_timeout_s=1.0, engine=engine) as proxy:
        for mode, code in (("huge_declared", 502), ("huge_chunked", 502)):
            hostile.mode = mode
            sid = httpx.post(proxy.url + "/sessions").json()["session_id"]
            r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions", json=MSG, timeout=60)
            assert r.status_code == code, (mode, r.text)
            assert r.json()["error"]["code"] == "engine_answer_too_large"
            assert httpx.get(f"{proxy.url}/sessions/{sid}").json()["steps"] == 0
        for mode, status, code in (("stream_huge_line", 502, "engine_answer_too_large"),
                                   ("stream_keepalive", 504, "engine_timeout")):
            hostile.mode = mode
            sid = httpx.post(proxy.url + "/sessions").json()["session_id"]
            # Nothing came before the failure: the agent gets a plain error status, not a 200 stream.
            r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions", json={**MSG, "stream": True},
                           timeout=60)
            assert r.status_code == status, (mode, r.text)
            assert r.json()["error"]["code"] == code, (mode, r.text)
            assert httpx.get(f"{proxy.url}/sessions/{sid}").json()["steps"] == 0


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_the_cap_counts_the_bytes_of_an_ordinary_answer(hostile, transport):
    hostile.mode = "ok"

    async def go(cap):
        client = SGLangClient(hostile.url, timeout=10, transport=_transport(transport), max_answer_bytes=cap)
        try:
            return await client.generate([1, 2], {})
        finally:
            await client.close()

    assert asyncio.run(go(CAP))["output_ids"] == [72, 105]
    with pytest.raises(EngineAnswerTooLargeError):
        asyncio.run(go(64))  # the answer is ~250 bytes
