"""The Proxy's hot-path JSON (orjson, stdlib fallback) and the engine client that uses it."""

from __future__ import annotations

import json

import pytest

from dressage.proxy import fastjson


def test_loads_gives_the_stdlib_value_for_an_engine_answer():
    body = {"output_ids": [1, 2, 3], "meta_info": {"output_token_logprobs": [[-0.5, 1, None], [-1.25, 2, "x"]],
                                                    "routed_experts": "AAEC", "weight_version": "7"}}
    text = json.dumps(body).encode()
    assert fastjson.loads(text) == json.loads(text) == body


def test_loads_falls_back_to_the_stdlib_for_nan_and_huge_ints():
    # orjson refuses both; the stdlib accepts them, and the wire checks then refuse with a typed error.
    value = fastjson.loads(b'{"lp": NaN, "big": 123456789012345678901234567890}')
    assert value["big"] == 123456789012345678901234567890
    assert value["lp"] != value["lp"]  # NaN


def test_loads_refuses_what_is_not_json():
    with pytest.raises(ValueError):
        fastjson.loads(b"{not json")


def test_dumps_round_trips_and_falls_back():
    value = {"ids": list(range(50)), "text": "héllo", "n": None}
    assert json.loads(fastjson.dumps(value)) == value
    big = {"big": 2**70}
    assert json.loads(fastjson.dumps(big)) == big  # orjson cannot write it: the stdlib does


def test_client_parses_the_engine_answer_and_keeps_the_typed_errors():
    import asyncio

    import httpx

    from dressage.errors import WireFormatError
    from dressage.fields import decode_generate_response
    from dressage.proxy.engines.sglang_client import SGLangClient

    sent: list[dict] = []
    answers = iter([b'{"output_ids": [5], "meta_info": {"output_token_logprobs": [[NaN, 5, null]],'
                    b' "finish_reason": {"type": "stop"}}}', b"<html>oops</html>"])

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        assert request.headers["content-type"] == "application/json"
        return httpx.Response(200, content=next(answers))

    async def run() -> None:
        async with SGLangClient("http://engine", transport=httpx.MockTransport(handler)) as client:
            body = await client.generate([1, 2, 3], {"max_new_tokens": 4}, rid="r1")
            with pytest.raises(WireFormatError, match="not finite"):
                decode_generate_response(body, prompt_len=3)
            with pytest.raises(WireFormatError, match="not JSON"):
                await client.generate([1], {"max_new_tokens": 1})

    asyncio.run(run())
    assert sent[0] == {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}, "return_logprob": True,
                       "rid": "r1"}
