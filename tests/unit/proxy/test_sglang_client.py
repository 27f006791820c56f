"""SGLangClient against a mock transport: request bodies and error translation at the boundary."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from dressage.errors import EngineError, EngineRequestError, EngineTimeout, EngineUnavailable, WireFormatError
from dressage.proxy.engines.sglang_client import SGLangClient


def _client(handler) -> SGLangClient:
    return SGLangClient("http://engine.test/", transport=httpx.MockTransport(handler))


def _run(coro):
    return asyncio.run(coro)


def test_generate_sends_sglang_body_and_returns_json():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["path"] = request.url.path
        seen["body"] = json.loads(request.content)
        return httpx.Response(200, json={"text": "hi", "output_ids": [1], "meta_info": {"id": "r"}})

    async def go():
        async with _client(handler) as c:
            return await c.generate([1, 2, 3], {"max_new_tokens": 4}, return_routed_experts=True,
                                    routed_experts_start_len=2, rid="r", logprob_start_len=-1)

    out = _run(go())
    assert out["output_ids"] == [1]
    assert seen["path"] == "/generate"
    assert seen["body"] == {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4},
                            "return_logprob": True, "return_routed_experts": True,
                            "routed_experts_start_len": 2, "rid": "r", "logprob_start_len": -1}


@pytest.mark.parametrize("make,error,status", [
    (lambda r: httpx.Response(503, json={"error": {"message": "overloaded"}}), EngineUnavailable, 503),
    (lambda r: httpx.Response(400, json={"error": {"message": "bad sampling"}}), EngineRequestError, 400),
])
def test_http_errors_become_engine_errors_with_status(make, error, status):
    async def go():
        async with _client(make) as c:
            await c.generate([1])

    with pytest.raises(error) as info:
        _run(go())
    assert info.value.status_code == status
    assert ("overloaded" if status == 503 else "bad sampling") in str(info.value)


@pytest.mark.parametrize("exc,error", [
    (httpx.ConnectError("refused"), EngineUnavailable),
    (httpx.RemoteProtocolError("reset"), EngineUnavailable),
    (httpx.ReadTimeout("slow"), EngineTimeout),
    (httpx.ConnectTimeout("slow"), EngineTimeout),
])
@pytest.mark.parametrize("streamed", [False, True], ids=["generate", "generate_stream"])
def test_transport_errors_are_translated(exc, error, streamed):
    def handler(request):
        raise exc

    async def go():
        async with _client(handler) as c:
            if streamed:
                return [chunk async for chunk in c.generate_stream([1])]
            await c.generate([1])

    with pytest.raises(error) as info:
        _run(go())
    # the transport's own error in between, named as httpx named it
    assert isinstance(info.value, EngineError) and info.value.__cause__.__cause__ is exc
    assert info.value.__cause__.kind == type(exc).__name__


def test_non_json_answer_is_a_wire_format_error():
    async def go():
        async with _client(lambda r: httpx.Response(200, content=b"<html>")) as c:
            await c.generate([1])

    with pytest.raises(WireFormatError, match="not JSON"):
        _run(go())


def test_health_is_a_bool_and_abort_posts_rid():
    bodies = []

    def handler(request):
        if request.url.path == "/abort_request":
            bodies.append(json.loads(request.content))
            return httpx.Response(200)
        raise httpx.ConnectError("down")

    async def go():
        async with _client(handler) as c:
            healthy = await c.health()
            await c.abort("r9")
            await c.abort(abort_all=True)
            return healthy

    assert _run(go()) is False
    assert bodies == [{"rid": "r9", "abort_all": False}, {"rid": "", "abort_all": True}]


def test_stream_yields_chunks_until_done():
    payload = (b'data: {"text":"a","output_ids":[1],"meta_info":{"finish_reason":null}}\n\n'
               b'data: {"text":"ab","output_ids":[1,2],"meta_info":{"finish_reason":{"type":"length"}}}\n\n'
               b"data: [DONE]\n\n")

    async def go():
        async with _client(lambda r: httpx.Response(200, content=payload,
                                                    headers={"content-type": "text/event-stream"})) as c:
            return [chunk async for chunk in c.generate_stream([1], {"max_new_tokens": 2})]

    chunks = _run(go())
    assert [c["output_ids"] for c in chunks] == [[1], [1, 2]]


def test_input_ids_as_an_array_are_sent_as_the_same_json():
    import numpy as np

    from dressage.proxy import fastjson

    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.content)
        return httpx.Response(200, json={"text": "", "output_ids": [1], "meta_info": {}})

    ids = [0, 5, 151643, 2**31 - 1]

    async def go():
        async with _client(handler) as c:
            for value in (ids, np.asarray(ids, dtype=np.int32), np.asarray(ids, dtype=np.int64),
                          np.repeat(np.asarray(ids, dtype=np.int32), 2)[::2], np.asarray(ids, dtype=">i4")):
                await c.generate(value, {"max_new_tokens": 1}, rid="r")

    _run(go())
    assert len(set(seen)) == 1 and json.loads(seen[0])["input_ids"] == ids
    # the standard library's fallback writes arrays alike
    assert json.loads(fastjson.dumps({"a": np.asarray(ids, dtype=">i8"), "b": np.int32(3)}, numpy=True)) == \
        {"a": ids, "b": 3}
    with pytest.raises(TypeError):
        fastjson.dumps({"a": np.asarray(ids)})  # only where asked
