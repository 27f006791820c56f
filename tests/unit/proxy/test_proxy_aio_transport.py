"""The engine transports: the client over aiohttp's pool gives the same answers and the same typed errors
as over an httpx transport, and both transports answer the same at the seam itself."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import math
import socket

import httpx
import numpy as np
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

from dressage.errors import DressageError, EngineRequestError, EngineTimeout, EngineUnavailable, WireFormatError
from dressage.fields.r3_stream import RoutedExpertsSpec
from dressage.proxy import fastjson
from dressage.proxy.engines.aio_transport import AiohttpTransport
from dressage.proxy.engines.httpx_transport import HttpxTransport
from dressage.proxy.engines.sglang_client import SGLangClient
from dressage.proxy.engines.transport import EngineTransportError, EngineTransportTimeout
from dressage.serving import UvicornServer

ANSWER = {"text": "hé", "output_ids": [5, 6], "meta_info": {"output_token_logprobs": [[-0.5, 5, None], [-1.25, 6, None]],
                                                           "weight_version": "3"}}
ROWS = np.random.default_rng(0).integers(0, 200, size=(3000, 4, 2), dtype=np.int32)  # ~130 KiB of base64
R3_ANSWER = {"output_ids": [5, 6], "meta_info": {
    "finish_reason": {"type": "stop"}, "output_token_logprobs": [[-0.5, 5, None], [-1.25, 6, None]],
    "routed_experts": base64.b64encode(ROWS.tobytes()).decode()}}
SPEC = RoutedExpertsSpec(4, 2, "uint8", 200)


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
        if mode == "stall":  # the head at once, then a body that stops half way
            async def stalled():
                yield b'{"output_ids": [5'
                await asyncio.sleep(2.0)
                yield b"]}"
            return StreamingResponse(stalled(), media_type="application/json")
        if body.get("stream"):
            async def chunks():
                for n in (1, 2):
                    yield f"data: {json.dumps({'text': 'x' * n, 'meta_info': {}})}\n\n".encode()
                if mode == "r3":
                    yield f"data: {json.dumps({**R3_ANSWER, 'text': 'xyz'})}\n\n".encode()
                yield b"data: [DONE]\n\n"
            return StreamingResponse(chunks(), media_type="text/event-stream")
        if mode in ("r3", "r3-gzip", "r3-pieces", "r3-bad"):
            answer = R3_ANSWER
            if mode == "r3-bad":  # an id beyond the model's 200 experts
                bad = ROWS.copy()
                bad[7, 1, 0] = 250
                answer = {**R3_ANSWER, "meta_info": {**R3_ANSWER["meta_info"],
                                                     "routed_experts": base64.b64encode(bad.tobytes()).decode()}}
            data = json.dumps(answer).encode()
            if mode == "r3-gzip":
                return Response(gzip.compress(data), media_type="application/json",
                                headers={"content-encoding": "gzip"})
            if mode == "r3-pieces":
                async def pieces():
                    for i in range(0, len(data), 4093):
                        yield data[i:i + 4093]
                return StreamingResponse(pieces(), media_type="application/json")
            return Response(data, media_type="application/json")
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


TRANSPORTS = {"aiohttp": lambda: AiohttpTransport(8), "httpx": lambda: HttpxTransport(httpx.AsyncHTTPTransport())}


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


def test_streamed_answers_come_through_aiohttp(engine):
    url, _ = engine

    async def go():
        async with SGLangClient(url) as client:
            return [c async for c in client.generate_stream([1, 2])]

    assert [c["text"] for c in asyncio.run(go())] == ["x", "xx"]


def test_streamed_lines_are_the_body_split_at_newlines(engine):
    url, _ = engine

    async def go(transport):
        body = json.dumps({"input_ids": [1], "sampling_params": {}, "stream": True}).encode()
        resp = await transport.send("POST", url + "/generate", body=body,
                                    headers={"content-type": "application/json"}, timeout=10)
        try:
            return resp.status, resp.headers["content-type"], [line async for line in resp.lines()]
        finally:
            await resp.aclose()
            await transport.aclose()

    got = {t: asyncio.run(go(make())) for t, make in TRANSPORTS.items()}
    assert got["aiohttp"] == got["httpx"], got
    status, ctype, lines = got["aiohttp"]
    assert status == 200 and ctype.startswith("text/event-stream")
    assert lines == ['data: {"text": "x", "meta_info": {}}', "", 'data: {"text": "xx", "meta_info": {}}', "",
                     "data: [DONE]", ""]


@pytest.mark.parametrize("name", list(TRANSPORTS))
def test_the_transports_raise_their_own_errors_named_as_httpx_names_them(engine, name):
    url, _ = engine

    async def go(target, mode, timeout):
        transport = TRANSPORTS[name]()
        try:
            body = json.dumps({"input_ids": [1], "sampling_params": {"mode": mode}}).encode()
            resp = await transport.send("POST", target + "/generate", body=body, headers={}, timeout=timeout)
            try:
                return await resp.read()
            finally:
                await resp.aclose()
        finally:
            await transport.aclose()

    with pytest.raises(EngineTransportError) as refused:
        asyncio.run(go(f"http://127.0.0.1:{_closed_port()}", "ok", 10))
    assert refused.value.kind == "ConnectError" and not isinstance(refused.value, EngineTransportTimeout)
    with pytest.raises(EngineTransportTimeout) as stalled:
        asyncio.run(go(url, "stall", 0.3))
    assert stalled.value.kind == "ReadTimeout"


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


# -- one seam, two transports: aiohttp's pool answers as httpx's own transport does ------------------


def _outcome(url: str, transport: str, call, timeout: float = 10.0):
    """What ``call(client)`` gives over that transport: ("ok", value) or ("error", type, message, status)."""

    async def go():
        async with SGLangClient(url, timeout=timeout, transport=TRANSPORTS[transport]()) as client:
            return await call(client)

    try:
        return ("ok", asyncio.run(go()))
    except DressageError as exc:
        return ("error", type(exc), str(exc), getattr(exc, "status_code", None))


def _plain(value):
    """An answer with its arrays as (dtype, shape, bytes), comparable with ``==``."""
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), value.shape, value.tobytes())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def _generate(mode: str, **kw):
    return lambda client: client.generate([1, 2], {"mode": mode}, **kw)


def _stream(mode: str, **kw):
    async def call(client):
        return [chunk async for chunk in client.generate_stream([1, 2], {"mode": mode}, **kw)]
    return call


R3 = dict(return_routed_experts=True, routed_experts_spec=SPEC)

SCENARIOS = {
    "answer": _generate("ok", routing_key="s-1"),
    "nan": _generate("nan"),
    "not-json": _generate("not-json"),
    "busy": _generate("busy"),
    "bad": _generate("bad"),
    "r3": _generate("r3", **R3),
    "r3-gzip": _generate("r3-gzip", **R3),
    "r3-pieces": _generate("r3-pieces", **R3),
    "r3-bad": _generate("r3-bad", **R3),
    "r3-error-status": _generate("bad", **R3),
    "r3-whole": _generate("r3", return_routed_experts=True),
    "stream": _stream("ok"),
    "stream-r3": _stream("r3", **R3),
    "stream-error-status": _stream("busy"),
    "model-info-404": lambda client: client.model_info(),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_both_transports_give_the_same_answer_or_the_same_typed_error(engine, name):
    url, _ = engine
    got = {t: _outcome(url, t, SCENARIOS[name]) for t in TRANSPORTS}
    assert _plain(got["aiohttp"]) == _plain(got["httpx"]), got


def test_both_transports_decode_the_routing_into_the_storage_dtype(engine):
    url, _ = engine
    for t in TRANSPORTS:
        for name in ("r3", "r3-gzip", "r3-pieces"):
            kind, answer = _outcome(url, t, SCENARIOS[name])
            routed = answer["meta_info"]["routed_experts"]
            assert routed.dtype == np.uint8 and np.array_equal(routed, ROWS), (t, name)
        kind, chunks = _outcome(url, t, SCENARIOS["stream-r3"])
        assert np.array_equal(chunks[-1]["meta_info"]["routed_experts"], ROWS)
        kind, answer = _outcome(url, t, SCENARIOS["r3-whole"])
        assert answer["meta_info"]["routed_experts"] == R3_ANSWER["meta_info"]["routed_experts"]  # not asked
        error = _outcome(url, t, SCENARIOS["r3-bad"])
        assert error[0] == "error" and error[1].__name__ == "ExpertIdRangeError" and "250" in error[2], error


@pytest.mark.parametrize("mode", ["slow", "stall"])
def test_both_transports_time_out_alike(engine, mode):
    url, _ = engine
    got = {t: _outcome(url, t, _generate(mode), timeout=0.3) for t in TRANSPORTS}
    assert got["aiohttp"] == got["httpx"] and got["httpx"][1] is EngineTimeout, got
    fed = {t: _outcome(url, t, _generate(mode, **R3), timeout=0.3) for t in TRANSPORTS}  # read as it arrives
    assert fed["aiohttp"] == fed["httpx"] and fed["httpx"][1] is EngineTimeout, fed
    streamed = {t: _outcome(url, t, _stream("slow"), timeout=0.3) for t in TRANSPORTS}
    assert streamed["aiohttp"] == streamed["httpx"] and streamed["httpx"][1] is EngineTimeout, streamed


def test_both_transports_refuse_a_closed_port_alike():
    url = f"http://127.0.0.1:{_closed_port()}"
    got = {t: _outcome(url, t, _generate("ok")) for t in TRANSPORTS}
    for t, outcome in got.items():
        assert outcome[0] == "error" and outcome[1] is EngineUnavailable, outcome
        # the same httpx exception, named the same way (its own text is each library's)
        assert outcome[2].startswith(f"POST {url}/generate: ConnectError: "), outcome


def test_lines_are_whole_however_the_body_is_cut():
    from dressage.proxy.engines.transport import EngineResponse

    class Pieces(EngineResponse):
        def __init__(self, pieces):
            super().__init__(200, {})
            self._pieces = pieces

        async def pieces(self):
            for piece in self._pieces:
                yield piece

    body = "data: é1\r\n\ndata: " + "x" * 5000 + "\n\ndata: [DONE]"
    want = ["data: é1", "", "data: " + "x" * 5000, "", "data: [DONE]"]
    raw = body.encode()

    async def lines(pieces):
        return [line async for line in Pieces(pieces).lines()]

    for size in (1, 7, 4096, len(raw)):
        assert asyncio.run(lines([raw[i:i + size] for i in range(0, len(raw), size)])) == want, size
