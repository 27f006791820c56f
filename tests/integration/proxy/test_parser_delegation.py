"""Replies parsed by the engine (SGLang's ``/parse_function_call`` and ``/separate_reasoning``, answered
by the built-in engine with the same parsers) read the same as replies parsed in the Proxy."""

import asyncio
import json

import httpx
import pytest

from dressage.proxy.engines.sglang_client import SGLangClient
from dressage.proxy.parsers import EngineParser, make_parser, read_assistant_message
from parser_replies import CALLS, FAMILIES, TOOLS, render


def _read(parser, text, tools):
    return asyncio.run(read_assistant_message(parser, text, call_id_prefix="c", tools=tools))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n_calls", [0, 1, 2])
def test_a_delegated_parse_reads_as_the_local_one(engine, family, n_calls):
    text = render(family, CALLS[:n_calls])
    if family == "gpt-oss" and not n_calls:
        text += "<|start|>assistant<|channel|>final<|message|>Plain words.<|return|>"
    local = make_parser(family)

    async def both():
        client = SGLangClient(engine.url)
        try:
            delegated = EngineParser(local, client, local.reasoning.name if local.reasoning else family)
            return (await read_assistant_message(delegated, text, call_id_prefix="c", tools=TOOLS),
                    await read_assistant_message(delegated, text, call_id_prefix="c", tools=TOOLS, tool_calls=False))
        finally:
            await client.close()

    with_calls, without = asyncio.run(both())
    assert with_calls == _read(local, text, TOOLS)
    assert len(with_calls.get("tool_calls", [])) == n_calls
    assert without == asyncio.run(read_assistant_message(local, text, call_id_prefix="c", tool_calls=False))


def test_the_engine_answers_sglangs_shapes_and_names_a_bad_field(engine):
    text = render("qwen", CALLS[:1])
    answer = text.split("</think>\n\n", 1)[1]
    r = httpx.post(f"{engine.url}/parse_function_call", json={"text": answer, "tool_call_parser": "qwen",
                                                              "tools": TOOLS})
    assert r.status_code == 200
    body = r.json()
    assert body["normal_text"] == "Let me check." and body["calls"] == [
        {"tool_index": 0, "name": "get_weather", "parameters": json.dumps(CALLS[0][1])}]
    r = httpx.post(f"{engine.url}/separate_reasoning", json={"text": text, "reasoning_parser": "qwen3"})
    assert r.json() == {"reasoning_text": "I think so.", "text": answer}
    r = httpx.post(f"{engine.url}/parse_function_call", json={"text": text, "tool_call_parser": "nope", "tools": []})
    assert r.status_code == 400 and "tool_call_parser" in r.json()["error"]["message"]
    r = httpx.post(f"{engine.url}/separate_reasoning", json={"text": 5, "reasoning_parser": "qwen3"})
    assert r.status_code == 400 and "text" in r.json()["error"]["message"]


def test_a_proxy_parsing_on_the_engine_answers_as_one_parsing_itself(engine, proxy_stack):
    import openai

    tools = [{"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}}]
    answers = []
    for on_engine in (False, True):
        stack = proxy_stack(engine.url, parse_on_engine=on_engine)
        assert isinstance(stack.proxy.service.parser, EngineParser) is on_engine
        replies = []
        for seed in range(6):
            sid = httpx.post(stack.url + "/sessions", timeout=20).json()["session_id"]
            client = openai.OpenAI(base_url=f"{stack.url}/sessions/{sid}/v1", api_key="none", max_retries=0)
            out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"find {seed}"}],
                                                 tools=tools, seed=seed, max_tokens=80)
            msg = out.choices[0].message
            replies.append((msg.content, [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]))
        answers.append(replies)
    assert answers[0] == answers[1] and any(calls for _, calls in answers[0])


@pytest.mark.parametrize("served, expected", [("zai-org/GLM-4.6", "glm45"), ("tiny-moe", "qwen"),
                                              ("/models/Qwen3.6-35B-A3B", "qwen3_coder")])
def test_the_proxy_picks_its_parsers_from_the_engines_model_path(proxy_stack, served, expected):
    from dressage.testing.stack import start_engine

    srv = start_engine(served_model_name=served)
    try:
        stack = proxy_stack(srv.url)
        assert stack.proxy.config.server.tool_call_parser == expected
        assert stack.proxy.service.parser.name == expected
        named = proxy_stack(srv.url, tool_call_parser="kimi_k2", reasoning_parser="kimi")
        assert named.proxy.service.parser.name == "kimi_k2" and named.proxy.service.parser.reasoning.start == "◁think▷"
    finally:
        srv.stop()


def test_reply_texts_keep_special_tokens_for_families_whose_markers_are_special(engine, proxy_stack):
    from dressage.tokenizer import load_tokenizer

    tok = load_tokenizer("byte")
    special = sorted(set(tok.special_token_ids) - set(tok.stop_token_ids))[0]
    ids = tok.encode("hi") + [special] + tok.encode("there") + [tok.im_end_token_id]
    marker = tok.decode([special], skip_special_tokens=False)
    for family, expected in (("kimi_k2", f"hi{marker}there"), ("gpt-oss", f"hi{marker}there"), ("qwen", "hithere")):
        calls = proxy_stack(engine.url, tool_call_parser=family).proxy.service.chat.calls
        assert calls.decode(ids) == expected  # the end-of-turn token is left out either way
