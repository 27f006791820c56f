"""The Responses API, text completions and the model object against the real Proxy and built-in engine.

The engine's reply is a pure function of the prompt ids and sampling, so a conversation sent
through ``/v1/responses`` and the same conversation sent through chat completions must record the
same tokens; previous_response_id chaining, full history, streamed and non-streamed likewise.
"""

import asyncio
import json

import httpx
import openai
import pytest

from dressage.engine.core import Engine
from dressage.testing.stack import start_engine, start_proxy

SYSTEM = "You are terse."
USERS = ["What is 6*7?", "And 7*8?", "Sum them."]
FLAT_TOOLS = [{"type": "function", "name": "calculator", "description": "evaluate",
               "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in FLAT_TOOLS]
SAMPLING = {"temperature": 0.7, "max_output_tokens": 40}
TOOL_SAMPLING = {"temperature": 0.7, "max_output_tokens": 160}  # a byte-token tool call is long


ENGINE = {"seed": 5, "tool_call_rate": 0.6, "mean_response_tokens": 20}


@pytest.fixture(scope="module")
def proxy(engine):
    with start_proxy(engine.url, dp_size=1) as stack:
        yield stack


def _session(proxy):
    r = httpx.post(proxy.url + "/sessions", json={}, timeout=20).json()
    return r["session_id"], openai.OpenAI(base_url=r["base_url"], api_key="none", max_retries=0)


def _segments(proxy, sid):
    fin = httpx.post(f"{proxy.url}/sessions/{sid}/finalize", json={}, timeout=20).json()
    segs = httpx.get(f"{proxy.url}/sessions/{sid}/segments", timeout=20).json()
    assert fin["segments"] == len(segs)
    return segs


def _items(response):
    return [item.model_dump(exclude_none=True) for item in response.output]


def _chat_run(proxy):
    sid, client = _session(proxy)
    msgs = [{"role": "system", "content": SYSTEM}]
    for text in USERS:
        msgs.append({"role": "user", "content": text})
        resp = client.chat.completions.create(model="m", messages=msgs, temperature=0.7, max_tokens=40)
        msgs.append(resp.choices[0].message.model_dump(exclude_none=True))
    return _segments(proxy, sid)


def _responses_run(proxy, *, chain, stream=False):
    sid, client = _session(proxy)
    history, previous, texts = [], None, []
    for text in USERS:
        new = [{"role": "user", "content": [{"type": "input_text", "text": text}]}]
        kw = dict(model="m", instructions=SYSTEM, **SAMPLING)
        if chain:
            kw.update(input=new, previous_response_id=previous)
        else:
            kw.update(input=history + new)
        if stream:
            with client.responses.stream(**{k: v for k, v in kw.items() if v is not None}) as events:
                kinds = [e.type for e in events]
                resp = events.get_final_response()
            assert kinds[:2] == ["response.created", "response.in_progress"]
            assert kinds[-1] in ("response.completed", "response.incomplete")
            assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
        else:
            resp = client.responses.create(**{k: v for k, v in kw.items() if v is not None})
        assert resp.id.startswith("resp_") and resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
        texts.append(resp.output_text)
        history += new + _items(resp)
        previous = resp.id
    return _segments(proxy, sid), texts


def test_linear_responses_conversation_is_one_segment_with_the_chat_tokens(proxy):
    chat = _chat_run(proxy)
    resp, texts = _responses_run(proxy, chain=False)
    assert len(chat) == len(resp) == 1
    assert resp[0]["tokens"] == chat[0]["tokens"] and resp[0]["loss_mask"] == chat[0]["loss_mask"]
    assert len(resp[0]["step_ids"]) == 3 and resp[0]["boundary_reason"] == "new_session"
    assert all(texts)


def test_previous_response_id_records_what_full_history_records(proxy):
    full, texts_full = _responses_run(proxy, chain=False)
    chained, texts_chained = _responses_run(proxy, chain=True)
    assert len(chained) == 1
    assert chained[0]["tokens"] == full[0]["tokens"] and chained[0]["loss_mask"] == full[0]["loss_mask"]
    assert texts_chained == texts_full


def test_streamed_and_non_streamed_record_the_same_steps(proxy):
    plain, texts_plain = _responses_run(proxy, chain=True)
    streamed, texts_streamed = _responses_run(proxy, chain=True, stream=True)
    assert len(streamed) == 1
    assert streamed[0]["tokens"] == plain[0]["tokens"] and streamed[0]["loss_mask"] == plain[0]["loss_mask"]
    assert texts_streamed == texts_plain


def _until_call(client, *, stream):
    """Ask until the model calls the tool (the engine calls tools for some prompts, not all)."""
    for i in range(12):
        new = [{"role": "user", "content": f"Compute case {i} with the calculator."}]
        if stream:
            with client.responses.stream(model="m", input=new, tools=FLAT_TOOLS, **TOOL_SAMPLING) as events:
                kinds = [e.type for e in events]
                resp = events.get_final_response()
        else:
            kinds, resp = [], client.responses.create(model="m", input=new, tools=FLAT_TOOLS, **TOOL_SAMPLING)
        calls = [o for o in resp.output if o.type == "function_call"]
        if calls:
            return new, resp, calls, kinds
    raise AssertionError("the engine never called the tool")


@pytest.mark.parametrize("stream", [False, True])
def test_function_call_round_trip_continues_the_segment(proxy, stream):
    sid, client = _session(proxy)
    new, resp, calls, kinds = _until_call(client, stream=stream)
    if stream:
        assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert all(c.call_id and c.name == "calculator" and c.arguments.startswith("{") for c in calls)
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": "42"} for c in calls]
    follow = client.responses.create(model="m", input=outputs, previous_response_id=resp.id, tools=FLAT_TOOLS,
                                     **TOOL_SAMPLING)
    assert follow.status in ("completed", "incomplete") and follow.previous_response_id == resp.id
    segs = _segments(proxy, sid)
    last = [s for s in segs if len(s["step_ids"]) == 2]
    assert len(last) == 1, "the tool result continued the call's Segment (TITO)"

    # The same turn as chat messages records the same tokens.
    sid2, chat = _session(proxy)
    msgs = [{"role": "user", "content": new[0]["content"]}]
    first = chat.chat.completions.create(model="m", messages=msgs, tools=CHAT_TOOLS, temperature=0.7, max_tokens=160)
    msg = first.choices[0].message
    assert [(c.function.name, c.function.arguments) for c in msg.tool_calls] == [(c.name, c.arguments) for c in calls]
    msgs += [msg.model_dump(exclude_none=True)] + [{"role": "tool", "tool_call_id": c.id, "content": "42"}
                                                   for c in msg.tool_calls]
    chat.chat.completions.create(model="m", messages=msgs, tools=CHAT_TOOLS, temperature=0.7, max_tokens=160)
    (seg2,) = _segments(proxy, sid2)
    assert seg2["tokens"] == last[0]["tokens"]


NAMESPACE_TOOLS = [{"type": "namespace", "name": "math", "description": "Arithmetic helpers.",
                    "tools": [dict(FLAT_TOOLS[0], name="calc")]}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_namespaced_call_comes_back_with_its_namespace_and_continues_the_segment(proxy, stream):
    sid, client = _session(proxy)
    for i in range(12):
        new = [{"role": "user", "content": f"Compute case {i} with the math tools."}]
        if stream:
            with client.responses.stream(model="m", input=new, tools=NAMESPACE_TOOLS, store=False,
                                         **TOOL_SAMPLING) as events:
                done = [e.item for e in events if e.type == "response.output_item.done"]
                resp = events.get_final_response()
        else:
            resp = client.responses.create(model="m", input=new, tools=NAMESPACE_TOOLS, store=False, **TOOL_SAMPLING)
            done = list(resp.output)
        calls = [o for o in resp.output if o.type == "function_call"]
        if calls:
            break
    else:
        raise AssertionError("the engine never called the tool")
    assert {(c.namespace, c.name) for c in calls} == {("math", "calc")}
    assert [o.model_dump(exclude_none=True) for o in done] == [o.model_dump(exclude_none=True) for o in resp.output]
    # The whole history sent back (store is false), each call with its output, continues the Segment.
    items = new + [o.model_dump(exclude_none=True) for o in resp.output] + [
        {"type": "function_call_output", "call_id": c.call_id, "output": "42"} for c in calls]
    follow = client.responses.create(model="m", input=items, tools=NAMESPACE_TOOLS, store=False, **TOOL_SAMPLING)
    segs = [s for s in _segments(proxy, sid) if len(s["step_ids"]) == 2]
    assert len(segs) == 1 and sum(segs[0]["loss_mask"]) == resp.usage.output_tokens + follow.usage.output_tokens


def test_header_url_form_and_bad_requests_record_nothing(proxy):
    h = {"X-Session-Id": "resp-headers-1"}
    ok = httpx.post(proxy.url + "/v1/responses", headers=h, json={"input": "hi", "max_output_tokens": 8}, timeout=20)
    assert ok.status_code == 200 and ok.json()["object"] == "response"
    bad = [({"input": "x", "tools": [{"type": "web_search"}]}, "unsupported_parameter", "web_search"),
           ({"input": "x", "tools": [{"type": "namespace", "name": "n", "tools": [{"type": "mcp"}]}]},
            "unsupported_parameter", "mcp"),
           ({"input": "x", "truncation": "auto"}, "unsupported_parameter", "truncation"),
           ({"input": "x", "previous_response_id": "resp_unknown"}, "previous_response_not_found", "resp_unknown"),
           ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
            "unsupported_parameter", "input_image"),
           ({"input": [{"type": "item_reference", "id": "x"}]}, "unsupported_parameter", "item_reference"),
           ({"input": "x", "tool_choice": {"type": "file_search"}}, "unsupported_parameter", "file_search"),
           ({"input": "x", "background": True}, "unsupported_parameter", "background"),
           ({"input": []}, None, "no input")]
    for body, code, words in bad:
        r = httpx.post(proxy.url + "/v1/responses", headers=h, json=body, timeout=20)
        assert r.status_code == 400, body
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and words in err["message"]
        assert code is None or err["code"] == code
    # store=false: answered, but not kept for previous_response_id.
    unstored = httpx.post(proxy.url + "/v1/responses", headers=h, json={"input": "hi", "store": False}, timeout=20)
    r = httpx.post(proxy.url + "/v1/responses", headers=h,
                   json={"input": "more", "previous_response_id": unstored.json()["id"]}, timeout=20)
    assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found"
    info = httpx.get(proxy.url + "/sessions/resp-headers-1", timeout=20).json()
    assert info["steps"] == 2  # the two good calls; no failed one left anything behind


def test_text_completions_streamed_and_not_record_one_step_each(proxy):
    sid, client = _session(proxy)
    for prompt in (f"Once upon a time {i}" for i in range(20)):  # one whose reply outlasts max_tokens
        plain = client.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0.5, logprobs=1)
        if plain.choices[0].finish_reason == "length":
            break
    choice = plain.choices[0]
    assert plain.object == "text_completion" and plain.usage.completion_tokens == 12
    assert len(choice.logprobs.token_logprobs) == 12 and all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    assert "".join(choice.logprobs.tokens) == choice.text
    chunks = list(client.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0.5,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12
    ids = client.completions.create(model="m", prompt=[5, 6, 7, 8], max_tokens=5)
    assert ids.usage.prompt_tokens == 4
    # A stop string ends the text and is not part of it.
    stop = choice.text[3:5]
    cut = client.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0.5, stop=stop)
    assert cut.choices[0].text == choice.text[:choice.text.find(stop)] and cut.choices[0].finish_reason == "stop"
    cut_chunks = list(client.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0.5, stop=stop,
                                                stream=True))
    assert "".join(c.choices[0].text for c in cut_chunks) == cut.choices[0].text
    alts = client.completions.create(model="m", prompt=prompt, max_tokens=4, temperature=0.5, logprobs=2)
    top = alts.choices[0].logprobs.top_logprobs
    assert len(top) == 4 and all(len(t) == 2 and max(t.values()) <= 0 for t in top)
    for bad in ({"n": 2}, {"echo": True}, {"logprobs": 6}, {"prompt": ["a", "b"]}, {"suffix": "x"}):
        r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/completions", json={"prompt": "x", **bad}, timeout=20)
        assert r.status_code in (400, 422) and r.json()["error"]["type"] == "invalid_request_error"  # 422: schema
    steps = httpx.get(f"{proxy.url}/sessions/{sid}", timeout=20).json()["steps"]
    segs = _segments(proxy, sid)
    assert sum(len(s["step_ids"]) for s in segs) == steps
    # The streamed call recorded what the plain one did (same prompt and sampling: same tokens).
    full = [s["tokens"] for s in segs if len(s["tokens"]) == plain.usage.total_tokens]
    assert any(full.count(t) == 2 for t in full), [len(s["tokens"]) for s in segs]


def test_model_object_and_unknown_model(proxy):
    name = proxy.service.config.server.served_model_name
    sid, client = _session(proxy)
    model = client.models.retrieve(name)
    assert model.id == name and model.object == "model"
    r = httpx.get(proxy.url + "/v1/models/" + name, timeout=20)
    assert r.status_code == 200 and r.json()["id"] == name
    missing = httpx.get(proxy.url + "/v1/models/org/other-model", timeout=20)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert httpx.get(f"{proxy.url}/sessions/nope/v1/models/{name}", timeout=20).status_code == 404


def test_async_client_stream_create_true(proxy):
    async def run():
        r = httpx.post(proxy.url + "/sessions", json={}, timeout=20).json()
        client = openai.AsyncOpenAI(base_url=r["base_url"], api_key="none", max_retries=0)
        stream = await client.responses.create(model="m", input="Say something.", stream=True, **SAMPLING)
        events = [e async for e in stream]
        plain = await client.responses.create(model="m", input="Say something.", **SAMPLING)
        await client.close()
        return events, plain

    events, plain = asyncio.run(run())
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas.strip() == final.output_text.strip() == plain.output_text.strip()
    assert final.usage.output_tokens == plain.usage.output_tokens


def test_an_sdk_retry_gets_the_same_response_and_records_nothing(proxy):
    h = {"X-Session-Id": "resp-turns-1", "X-Turn-Id": "t1", "x-stainless-retry-count": "0"}
    retry = {**h, "x-stainless-retry-count": "1"}  # the OpenAI SDK's own retry of the same body
    body = {"input": "Tell me one thing.", "max_output_tokens": 30}
    first = httpx.post(proxy.url + "/v1/responses", headers=h, json=body, timeout=20).json()
    again = httpx.post(proxy.url + "/v1/responses", headers=retry, json=body, timeout=20).json()
    with httpx.stream("POST", proxy.url + "/v1/responses", headers=retry, json={**body, "stream": True},
                      timeout=20) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    replayed = json.loads(lines[-1][len("data: "):])
    assert again["id"] == first["id"] and again["output"] == first["output"]
    assert replayed["type"] == "response.completed" and replayed["response"]["output"] == first["output"]
    info = httpx.get(proxy.url + "/sessions/resp-turns-1", timeout=20).json()
    assert info["steps"] == 1
    # The replayed response is remembered like the first: it can be continued.
    follow = httpx.post(proxy.url + "/v1/responses", headers={"X-Session-Id": "resp-turns-1"},
                        json={"input": "More.", "previous_response_id": first["id"], "max_output_tokens": 30}, timeout=20)
    assert follow.status_code == 200
    assert httpx.get(proxy.url + "/sessions/resp-turns-1", timeout=20).json()["lineages"] == 1


def test_capabilities_name_the_openai_endpoints(proxy):
    endpoints = httpx.get(proxy.url + "/integration/capabilities", timeout=20).json()["dressage"]["endpoints"]
    for path in ("POST /v1/responses", "POST /sessions/{id}/v1/responses", "POST /v1/completions",
                 "POST /sessions/{id}/v1/completions", "GET /v1/models/{model}"):
        assert path in endpoints


def test_structured_output_and_logprobs_go_through_the_chat_path(proxy):
    sid, client = _session(proxy)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    resp = client.responses.create(model="m", input="Answer in JSON.", max_output_tokens=200,
                                   text={"format": {"type": "json_schema", "name": "out", "schema": schema,
                                                    "strict": True}})
    assert isinstance(json.loads(resp.output_text)["answer"], int)
    scored = client.responses.create(model="m", input="Say something.", max_output_tokens=20, top_logprobs=2,
                                     include=["message.output_text.logprobs"])
    (part,) = scored.output[0].content
    assert len(part.logprobs) == scored.usage.output_tokens  # every recorded token, as chat's logprobs
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in part.logprobs)
    r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/responses", json={"input": "x", "tool_choice": "required"},
                   timeout=20)
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_parameter"


@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_required_and_named_are_enforced_streamed_or_not(proxy, stream):
    sid, client = _session(proxy)
    for choice in ("required", {"type": "function", "name": "calculator"}):
        kw = dict(model="m", input="Use the calculator on 3.", tools=FLAT_TOOLS, tool_choice=choice, **TOOL_SAMPLING)
        if stream:
            with client.responses.stream(**kw) as events:
                kinds = [e.type for e in events]
                resp = events.get_final_response()
            assert kinds[0] == "response.created" and "response.function_call_arguments.done" in kinds
        else:
            resp = client.responses.create(**kw)
        calls = [o for o in resp.output if o.type == "function_call"]
        assert calls and all(c.name == "calculator" for c in calls)
    segs = _segments(proxy, sid)
    assert sum(len(s["step_ids"]) for s in segs) == 2  # refused draws are not recorded


def test_finalize_waits_for_a_streamed_response_in_flight():
    engine = start_engine(seed=5, tool_call_rate=0.0, mean_response_tokens=30, token_delay_s=0.02, stream_interval=2)
    server = start_proxy(engine.url, r3=False, dp_size=1)

    async def run():
        async with httpx.AsyncClient(timeout=20) as h:
            sid = (await h.post(server.url + "/sessions", json={})).json()["session_id"]
            body = {"input": "Talk a while.", "stream": True, "max_output_tokens": 30}
            async with h.stream("POST", f"{server.url}/sessions/{sid}/v1/responses", json=body) as r:
                lines = r.aiter_lines()
                async for line in lines:
                    if line.startswith("data: "):
                        break  # the response has started; the engine is still generating
                fin = await h.post(f"{server.url}/sessions/{sid}/finalize", json={"wait_s": 20})
                rest = [line async for line in lines]
            return fin.json(), rest

    try:
        fin, rest = asyncio.run(run())
        assert fin["in_flight_done"] is True and fin["num_steps"] == 1
        assert any('"type":"response.completed"' in line or '"type":"response.incomplete"' in line for line in rest)
    finally:
        server.close()
        engine.stop()


@pytest.mark.parametrize("keep_reasoning", [True, False], ids=["reasoning_sent_back", "reasoning_dropped"])
def test_qwen3_template_responses_tool_loop_with_reasoning_is_one_segment(qwen3, keep_reasoning):
    """On the real Qwen3 template: reasoning items and function calls sent back continue the Segment."""
    engine = start_engine(seed=11, tokenizer="qwen3", tool_call_rate=0.6, mean_response_tokens=20,
                          make_engine=lambda config: Engine(config, qwen3))
    server = start_proxy(engine.url, r3=False, tokenizer=qwen3, tokenizer_name="qwen3", request_timeout_s=30, dp_size=1)
    try:
        sid, client = _session(server)
        items = [{"role": "user", "content": "What is 6*7? Use the calculator."}]
        kinds, generated = set(), 0
        for _ in range(4):
            resp = client.responses.create(model="m", instructions="You are careful.", input=items, tools=FLAT_TOOLS,
                                           max_output_tokens=96, temperature=0.7)
            out = _items(resp)
            kinds |= {o["type"] for o in out}
            generated += resp.usage.output_tokens
            items += [o for o in out if keep_reasoning or o["type"] != "reasoning"]
            calls = [o for o in out if o["type"] == "function_call"]
            items += [{"type": "function_call_output", "call_id": c["call_id"], "output": "42"} for c in calls]
            if not calls:
                items.append({"role": "user", "content": "Check it once more."})
        (seg,) = _segments(server, sid)
        assert len(seg["step_ids"]) == 4 and "reasoning" in kinds
        assert sum(seg["loss_mask"]) == generated  # every generated token trained once, nothing else
    finally:
        server.close()
        engine.stop()
