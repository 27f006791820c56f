"""The engine client over aiohttp's pool: the same answers and the same typed errors as over httpx's."""

from __future__ import annotations

import asyncio
import json
import math
import socket

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

from dressage.errors import EngineRequestError, EngineTimeout, EngineUnavailable, WireFormatError
from dressage.proxy import fastjson
from dressage.proxy.engines.aio_transport import AiohttpTransport
from dressage.proxy.engines.sglang_client import SGLangClient
from dressage.serving import UvicornServer

ANSWER = {"text": "hé", "output_ids": [5, 6], "meta_info": {"output_token_logprobs": [[-0.5, 5, None], [-1.25, 6, None]],
                                                           "weight_version": "3"}}


def _app() -> FastAPI:
    app = FastAPI()
    seen: list = []
    app.state.seen = seen

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        body = json.loads(await request.body())
        seen.append((body, request.headers.get("authorization"), request.headers.get("x-smg-routing-key")))
        mode = body["sampling_params"].get("mode")
        if mode == "not-json":
            return Response(b"<html>oops", media_type="text/html")
        if mode == "nan":
            return Response(b'{"meta_info": {"x": NaN}}', media_type="application/json")
        if mode == "busy":
            return Response(b'{"detail": "overloaded"}', status_code=503, media_type="application/json")
        if mode == "bad":
            return Response(b'{"error": {"message": "bad input_ids"}}', status_code=400, media_type="application/json")
        if mode == "slow":
            await asyncio.sleep(2.0)
        if body.get("stream"):
            async def chunks():
                for n in (1, 2):
                    yield f"data: {json.dumps({'text': 'x' * n, 'meta_info': {}})}\n\n".encode()
                yield b"data: [DONE]\n\n"
            return StreamingResponse(chunks(), media_type="text/event-stream")
        return Response(json.dumps({**ANSWER, "echo": body["input_ids"]}), media_type="application/json")

    return app


@pytest.fixture(scope="module")
def engine():
    server = UvicornServer(_app(), name="fake-engine")
    url = server.start_background()
    yield url, server.app.state.seen
    server.stop()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_the_default_client_rides_aiohttp_and_sends_the_body_and_headers(engine):
    url, seen = engine

    async def go():
        async with SGLangClient(url, api_key="k1") as client:
            assert isinstance(client._transport, AiohttpTransport)
            return await client.generate([1, 2, 3], {"max_new_tokens": 2}, routing_key="s-1")

    out = asyncio.run(go())
    assert out["echo"] == [1, 2, 3] and out["text"] == "hé" and out["output_ids"] == [5, 6]
    body, auth, key = seen[-1]
    assert body["input_ids"] == [1, 2, 3] and body["sampling_params"] == {"max_new_tokens": 2}
    assert auth == "Bearer k1" and key == "s-1"


def test_one_client_serves_one_loop_after_another(engine):
    url, _ = engine
    client = SGLangClient(url)
    assert asyncio.run(client.generate([7]))["echo"] == [7]
    assert asyncio.run(client.generate([8]))["echo"] == [8]
    asyncio.run(client.close())


@pytest.mark.parametrize("mode,error,match", [
    ("not-json", WireFormatError, "not JSON"),
    ("busy", EngineUnavailable, "HTTP 503: overloaded"),
    ("bad", EngineRequestError, "HTTP 400: bad input_ids"),
])
def test_engine_failures_are_the_same_typed_errors(engine, mode, error, match):
    url, _ = engine

    async def go():
        async with SGLangClient(url) as client:
            await client.generate([1], {"mode": mode})

    with pytest.raises(error, match=match) as info:
        asyncio.run(go())
    if mode in ("busy", "bad"):
        assert info.value.status_code == (503 if mode == "busy" else 400)


def test_a_nan_literal_is_read_as_before(engine):
    url, _ = engine

    async def go():
        async with SGLangClient(url) as client:
            return await client.generate([1], {"mode": "nan"})

    assert math.isnan(asyncio.run(go())["meta_info"]["x"])


def test_deadline_and_refused_connection(engine):
    url, _ = engine

    async def slow():
        async with SGLangClient(url, timeout=0.3) as client:
            await client.generate([1], {"mode": "slow"})

    with pytest.raises(EngineTimeout):
        asyncio.run(slow())

    async def refused():
        async with SGLangClient(f"http://127.0.0.1:{_closed_port()}") as client:
            await client.generate([1])

    with pytest.raises(EngineUnavailable):
        asyncio.run(refused())


def test_streamed_answers_come_through_httpx_over_aiohttp(engine):
    url, _ = engine

    async def go():
        async with SGLangClient(url) as client:
            return [c async for c in client.generate_stream([1, 2])]

    assert [c["text"] for c in asyncio.run(go())] == ["x", "xx"]


def test_the_transport_under_a_plain_httpx_client(engine):
    url, _ = engine

    async def go():
        async with httpx.AsyncClient(transport=AiohttpTransport(4), timeout=10) as h:
            r = await h.post(url + "/generate", json={"input_ids": [4], "sampling_params": {}})
            return r.status_code, r.json()

    status, body = asyncio.run(go())
    assert status == 200 and body["echo"] == [4]


def test_fastjson_matches_the_stdlib():
    value = {"a": [1, 2.5, "é", None, True], "b": {"c": 2**40}}
    assert fastjson.loads(fastjson.dumps(value)) == value == json.loads(fastjson.dumps(value))
    # Beyond 64 bits orjson reads an integer as a float: an engine answer with such a token id is
    # still refused as not an integer, with the wire format's typed error.
    from dressage.fields.sglang import decode_generate_response

    body = fastjson.loads(b'{"output_ids": [123456789012345678901234567890], "meta_info": {}}')
    with pytest.raises(WireFormatError, match="output_ids"):
        decode_generate_response(body, prompt_len=1, want_logprobs=False)
    assert fastjson.loads(fastjson.dumps({"big": 2**70}))["big"] == 2**70
    assert json.loads(fastjson.dumps({"s": "\ud800"}))["s"] == "\ud800"  # a lone surrogate: the stdlib writes it
    with pytest.raises(ValueError):
        fastjson.loads(b'{"a": ')
