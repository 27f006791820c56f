"""SGLangClient against the built-in engine over loopback, and against a port nobody serves."""

from __future__ import annotations

import asyncio
import socket

import pytest

from dressage.engine import EngineConfig, EngineServer
from dressage.fields.config import model_from_preset
from dressage.errors import EngineRequestError, EngineUnavailable
from dressage.fields.sglang import decode_generate_response
from dressage.proxy.engines.sglang_client import SGLangClient
from dressage.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
MODEL = model_from_preset("tiny-moe")


@pytest.fixture(scope="module")
def engine_url():
    with EngineServer(EngineConfig(model=MODEL, port=0, token_delay_s=0.002)) as srv:
        yield srv.url


def test_generate_abort_and_info_through_the_client(engine_url):
    prompt = TOK.apply_chat_template([{"role": "user", "content": "hello"}])

    async def go():
        async with SGLangClient(engine_url, timeout=30) as client:
            assert await client.health()
            info = await client.model_info()
            out = await client.generate(prompt, {"max_new_tokens": 16}, return_routed_experts=True)
            task = asyncio.create_task(client.generate(prompt, {"max_new_tokens": 5000, "ignore_eos": True},
                                                       rid="long"))
            await asyncio.sleep(0.2)
            await client.abort("long")
            partial = await task
            with pytest.raises(EngineRequestError, match="unknown parameter"):
                await client.generate(prompt, {"max_tokens": 1})
            return info, out, partial

    info, out, partial = asyncio.run(go())
    assert info["num_hidden_layers"] == MODEL.num_layers
    dec = decode_generate_response(out, prompt_len=len(prompt), num_layers=MODEL.num_layers, topk=MODEL.topk,
                                   want_routed_experts=True)
    assert dec.routed_experts.shape[0] == len(prompt) + len(dec.output_ids) - 1
    assert partial["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(partial["output_ids"]) < 5000


def test_engine_down_is_unavailable_and_unhealthy():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there

    async def go():
        async with SGLangClient(f"http://127.0.0.1:{port}", timeout=5) as client:
            assert await client.health() is False
            await client.generate([1, 2])

    with pytest.raises(EngineUnavailable, match="ConnectError"):
        asyncio.run(go())


def test_routing_decoded_as_the_answer_arrives_equals_the_plain_decode(engine_url):
    """Over aiohttp: the same seeded answer read whole, and read piece by piece with its routing
    decoded on the fly into uint8 (handed up as an array), give the same ids; an error status is the
    same error."""
    import numpy as np

    from dressage.fields.r3_stream import RoutedExpertsSpec

    prompt = TOK.apply_chat_template([{"role": "user", "content": "hello " * 400}])
    spec = RoutedExpertsSpec(MODEL.num_layers, MODEL.topk, "uint8", MODEL.num_experts)
    sampling = {"max_new_tokens": 64, "temperature": 0.0}

    async def go():
        async with SGLangClient(engine_url, timeout=30) as client:
            plain = await client.generate(prompt, sampling, return_routed_experts=True)
            streamed = await client.generate(prompt, sampling, return_routed_experts=True, routed_experts_spec=spec)
            with pytest.raises(EngineRequestError, match="unknown parameter"):
                await client.generate(prompt, {"max_tokens": 1}, return_routed_experts=True,
                                      routed_experts_spec=spec)
            return plain, streamed

    plain, streamed = asyncio.run(go())
    assert isinstance(plain["meta_info"]["routed_experts"], str)
    assert isinstance(streamed["meta_info"]["routed_experts"], np.ndarray)
    kw = dict(prompt_len=len(prompt), num_layers=MODEL.num_layers, topk=MODEL.topk, want_routed_experts=True,
              routed_experts_dtype="uint8", num_experts=MODEL.num_experts)
    a, b = decode_generate_response(plain, **kw), decode_generate_response(streamed, **kw)
    assert a.routed_experts.dtype == b.routed_experts.dtype == "uint8"
    assert a.routed_experts.tobytes() == b.routed_experts.tobytes()
    assert a.output_ids.tolist() == b.output_ids.tolist()
