"""The Anthropic Messages API against the real Proxy and built-in engine, through the official ``anthropic`` SDK.

The engine's reply is a pure function of the prompt ids and sampling, so a conversation sent
through ``/v1/messages`` and the same conversation sent through chat completions must record the
same tokens; streamed and non-streamed likewise. Every recorded trajectory is checked: one Segment
per conversation while TITO holds, the loss mask's ones are the output tokens the client was told,
and R3 has a row per token but the last.
"""

import httpx
import openai
import pytest

from dressage.engine.core import Engine
from dressage.testing.stack import start_engine, start_proxy

anthropic = pytest.importorskip("anthropic")

SYSTEM = "You are terse."
USERS = ["What is 6*7?", "And 7*8?", "Sum them."]
TOOLS = [{"name": "calculator", "description": "evaluate",
          "input_schema": {"type": "object", "properties": {"a": {"type": "number"}}}}]
CHAT_TOOLS = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                 "parameters": t["input_schema"]}} for t in TOOLS]

T07, T05 = {"temperature": 0.7}, {"temperature": 0.5}
"""Sampling parameters the SDK no longer declares; the API (and the Proxy) still take them."""

ENGINE = {"seed": 5, "tool_call_rate": 0.6, "mean_response_tokens": 20}


@pytest.fixture(scope="module")
def proxy(engine):
    with start_proxy(engine.url, dp_size=1) as stack:
        yield stack


def _session(proxy):
    sid = httpx.post(proxy.url + "/sessions", json={}, timeout=20).json()["session_id"]
    return sid, anthropic.Anthropic(base_url=f"{proxy.url}/sessions/{sid}", api_key="dummy", max_retries=0)


def _chat(proxy):
    r = httpx.post(proxy.url + "/sessions", json={}, timeout=20).json()
    return r["session_id"], openai.OpenAI(base_url=r["base_url"], api_key="none", max_retries=0)


def _segments(proxy, sid):
    fin = httpx.post(f"{proxy.url}/sessions/{sid}/finalize", json={}, timeout=20).json()
    segs = httpx.get(f"{proxy.url}/sessions/{sid}/segments", timeout=20).json()
    assert fin["segments"] == len(segs)
    return segs


def _check_trajectory(seg, output_tokens):
    """Loss-mask ones are the reported output tokens; R3 rows and logprobs match the tokens."""
    assert sum(seg["loss_mask"]) == output_tokens
    assert len(seg["tokens"]) == seg["prompt_length"] + seg["response_length"]
    assert seg["large_fields"]["routed_experts"]["rows"] == len(seg["tokens"]) - 1
    assert seg["large_fields"]["logprobs"]["rows"] == seg["response_length"]


def _messages_run(proxy, *, stream=False):
    sid, client = _session(proxy)
    history, texts, output = [], [], 0
    for text in USERS:
        history.append({"role": "user", "content": text})
        kw = dict(model="m", max_tokens=40, extra_body=T07, messages=history,
                  system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}])
        if stream:
            with client.messages.stream(**kw) as events:
                kinds = [e.type for e in events]
                msg = events.get_final_message()
            assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
            assert "text" in kinds and "content_block_stop" in kinds
        else:
            msg = client.messages.create(**kw)
        assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
        assert msg.stop_reason in ("end_turn", "max_tokens") and msg.usage.cache_read_input_tokens == 0
        texts.append(msg.content[0].text)
        output += msg.usage.output_tokens
        history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
    (seg,) = _segments(proxy, sid)
    _check_trajectory(seg, output)
    return seg, texts


def test_a_messages_conversation_is_one_segment_with_the_chat_tokens(proxy):
    seg, texts = _messages_run(proxy)
    sid, chat = _chat(proxy)
    msgs = [{"role": "system", "content": SYSTEM}]
    for text in USERS:
        msgs.append({"role": "user", "content": text})
        resp = chat.chat.completions.create(model="m", messages=msgs, temperature=0.7, max_tokens=40)
        msgs.append(resp.choices[0].message.model_dump(exclude_none=True))
    (chat_seg,) = _segments(proxy, sid)
    assert seg["tokens"] == chat_seg["tokens"] and seg["loss_mask"] == chat_seg["loss_mask"]
    assert len(seg["step_ids"]) == 3 and all(texts)


def test_streamed_and_non_streamed_record_the_same_tokens(proxy):
    plain, texts_plain = _messages_run(proxy)
    streamed, texts_streamed = _messages_run(proxy, stream=True)
    assert streamed["tokens"] == plain["tokens"] and streamed["loss_mask"] == plain["loss_mask"]
    assert texts_streamed == texts_plain


def _until_tool_use(client, *, stream):
    """Ask until the model calls the tool (the engine calls tools for some prompts, not all)."""
    for i in range(12):
        messages = [{"role": "user", "content": f"Compute case {i} with the calculator."}]
        kw = dict(model="m", max_tokens=160, extra_body=T07, messages=messages, tools=TOOLS)
        if stream:
            with client.messages.stream(**kw) as events:
                kinds = [e.type for e in events]
                msg = events.get_final_message()
            assert "input_json" in kinds or not [b for b in msg.content if b.type == "tool_use"]
        else:
            msg = client.messages.create(**kw)
        if msg.stop_reason == "tool_use":
            return messages, msg
    raise AssertionError("the engine never called the tool")


@pytest.mark.parametrize("stream", [False, True])
def test_tool_loop_continues_the_segment_and_records_the_chat_tokens(proxy, stream):
    sid, client = _session(proxy)
    messages, first = _until_tool_use(client, stream=stream)
    uses = [b for b in first.content if b.type == "tool_use"]
    assert uses and all(u.id.startswith("toolu_") and u.name == "calculator" and isinstance(u.input, dict)
                        for u in uses)
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id,
                                               "content": [{"type": "text", "text": "42"}]} for u in uses]}]
    final = client.messages.create(model="m", max_tokens=160, extra_body=T07, messages=messages, tools=TOOLS)
    segs = _segments(proxy, sid)
    (loop,) = [s for s in segs if len(s["step_ids"]) == 2]  # the tool result continued the call's Segment
    _check_trajectory(loop, first.usage.output_tokens + final.usage.output_tokens)

    # The same turn as chat messages records the same tokens.
    sid2, chat = _chat(proxy)
    msgs = [{"role": "user", "content": messages[0]["content"]}]
    reply = chat.chat.completions.create(model="m", messages=msgs, tools=CHAT_TOOLS, temperature=0.7, max_tokens=160)
    msg = reply.choices[0].message
    assert [(c.function.name, c.function.arguments) for c in msg.tool_calls] == [
        ("calculator", __import__("json").dumps(u.input)) for u in uses]
    msgs += [msg.model_dump(exclude_none=True)] + [{"role": "tool", "tool_call_id": c.id, "content": "42"}
                                                   for c in msg.tool_calls]
    chat.chat.completions.create(model="m", messages=msgs, tools=CHAT_TOOLS, temperature=0.7, max_tokens=160)
    (seg2,) = _segments(proxy, sid2)
    assert seg2["tokens"] == loop["tokens"] and seg2["loss_mask"] == loop["loss_mask"]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_any_and_named_tool_always_call(proxy, stream):
    sid, client = _session(proxy)
    for choice in ({"type": "any"}, {"type": "tool", "name": "calculator"}):
        kw = dict(model="m", max_tokens=160, messages=[{"role": "user", "content": "Use the calculator on 3."}],
                  tools=TOOLS, tool_choice=choice)
        if stream:
            with client.messages.stream(**kw) as events:
                msg = events.get_final_message()
        else:
            msg = client.messages.create(**kw)
        assert msg.stop_reason == "tool_use" and [b.name for b in msg.content if b.type == "tool_use"]
    segs = _segments(proxy, sid)
    assert sum(len(s["step_ids"]) for s in segs) == 2  # refused draws are not recorded


def test_stop_sequences_end_the_text_and_are_named(proxy):
    sid, client = _session(proxy)
    msgs = [{"role": "user", "content": "Say a few words."}]
    full = client.messages.create(model="m", max_tokens=40, extra_body=T05, messages=msgs)
    text = full.content[0].text
    stop = text[4:6]
    cut = client.messages.create(model="m", max_tokens=40, extra_body=T05, messages=msgs, stop_sequences=[stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[:text.find(stop)]
    with client.messages.stream(model="m", max_tokens=40, extra_body=T05, messages=msgs,
                                stop_sequences=[stop]) as events:
        streamed = events.get_final_message()
    assert streamed.stop_reason == "stop_sequence" and streamed.stop_sequence == stop
    assert streamed.content[0].text == cut.content[0].text


def test_count_tokens_is_the_prompt_the_call_sends(proxy):
    sid, client = _session(proxy)
    kw = dict(model="m", system="Count me.", messages=[{"role": "user", "content": "How long is this prompt?"}],
              tools=TOOLS)
    counted = client.messages.count_tokens(**kw)
    msg = client.messages.create(max_tokens=8, **kw)
    assert counted.input_tokens == msg.usage.input_tokens > 0
    by_header = httpx.post(proxy.url + "/v1/messages/count_tokens", json=kw, timeout=20)
    assert by_header.status_code == 200 and by_header.json() == {"input_tokens": counted.input_tokens}
    assert httpx.get(f"{proxy.url}/sessions/{sid}", timeout=20).json()["steps"] == 1  # counting records nothing


def test_header_form_probes_and_bad_requests_answer_in_anthropic_shape(proxy):
    h = {"X-Session-Id": "anthropic-headers-1", "anthropic-version": "2023-06-01",
         "anthropic-beta": "interleaved-thinking-2025-05-14"}
    ok = httpx.post(proxy.url + "/v1/messages?beta=true", headers=h, timeout=20,
                    json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                          "thinking": {"type": "adaptive"}, "metadata": {"user_id": "u"}})
    assert ok.status_code == 200 and ok.json()["type"] == "message"
    base = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    bad = [({"model": "m", "messages": base["messages"]}, "max_tokens"),
           ({**base, "messages": [{"role": "user", "content": [
               {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
            "image"),
           ({**base, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
           ({**base, "presence_penalty": 1.0}, "presence_penalty"),
           ({**base, "tool_choice": {"type": "tool", "name": "nope"}, "tools": TOOLS}, "nope")]
    for body, words in bad:
        r = httpx.post(proxy.url + "/v1/messages", headers=h, json=body, timeout=20)
        assert r.status_code == 400, body
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
        assert words in err["error"]["message"]
    malformed = httpx.post(proxy.url + "/v1/messages", headers={**h, "content-type": "application/json"},
                           content=b"{not json", timeout=20)
    assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "invalid_request_error"
    missing = httpx.post(proxy.url + "/sessions/no-such-session/v1/messages?beta=true", json=base, timeout=20)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert httpx.get(proxy.url + "/sessions/anthropic-headers-1", timeout=20).json()["steps"] == 1
    assert httpx.head(proxy.url + "/sessions/anthropic-headers-1", timeout=20).status_code == 200
    assert httpx.head(proxy.url + "/", timeout=20).status_code == 200
    assert httpx.get(proxy.url + "/", timeout=20).status_code == 200
    assert httpx.head(proxy.url + "/sessions/no-such-session", timeout=20).status_code == 404
    endpoints = httpx.get(proxy.url + "/integration/capabilities", timeout=20).json()["dressage"]["endpoints"]
    assert {"POST /sessions/{id}/v1/messages", "POST /v1/messages/count_tokens", "HEAD /"} <= set(endpoints)
    # The SDK raises its typed errors from these bodies.
    _, client = _session(proxy)
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.create(model="m", max_tokens=8, messages=base["messages"],
                               tools=[{"type": "bash_20250124", "name": "bash"}])
    assert "bash_20250124" in exc.value.message


def test_the_agent_token_is_taken_from_x_api_key_and_refusals_take_anthropic_shape(engine, proxy_stack):
    stack = proxy_stack(engine.url, api_token="agent-secret", r3=False, max_body_bytes=4096)
    sid = httpx.post(stack.url + "/sessions", json={}, headers={"authorization": "Bearer agent-secret"},
                     timeout=20).json()["session_id"]
    good = anthropic.Anthropic(base_url=f"{stack.url}/sessions/{sid}", api_key="agent-secret", max_retries=0)
    assert good.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]).content
    wrong = anthropic.Anthropic(base_url=f"{stack.url}/sessions/{sid}", api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as exc:
        wrong.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert exc.value.status_code == 401 and exc.value.body["error"]["type"] == "authentication_error"
    big = httpx.post(f"{stack.url}/sessions/{sid}/v1/messages", headers={"x-api-key": "agent-secret"}, timeout=20,
                     json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x" * 5000}]})
    assert big.status_code == 413 and big.json()["type"] == "error"
    assert big.json()["error"]["type"] == "request_too_large"
    chat = httpx.post(f"{stack.url}/sessions/{sid}/v1/chat/completions", headers={"x-api-key": "wrong"}, timeout=20,
                      json={"messages": [{"role": "user", "content": "x"}]})
    assert chat.status_code == 401 and chat.json()["error"]["type"] == "authentication_error"  # OpenAI's shape
    assert "message" in chat.json()["error"] and "type" not in chat.json()


@pytest.mark.parametrize("keep_thinking", [True, False], ids=["thinking_sent_back", "thinking_dropped"])
def test_qwen3_template_thinking_and_tool_loop_is_one_segment(qwen3, keep_thinking):
    """On the real Qwen3 template: thinking blocks and tool_use sent back continue the Segment."""
    engine = start_engine(seed=11, tokenizer="qwen3", tool_call_rate=0.6, mean_response_tokens=20,
                          make_engine=lambda config: Engine(config, qwen3))
    server = start_proxy(engine.url, tokenizer=qwen3, tokenizer_name="qwen3", request_timeout_s=30, dp_size=1)
    try:
        sid, client = _session(server)
        messages = [{"role": "user", "content": "What is 6*7? Use the calculator."}]
        kinds, generated = set(), 0
        for turn in range(4):
            kw = dict(model="m", system="You are careful.", messages=messages, tools=TOOLS, max_tokens=96,
                      extra_body=T07, thinking={"type": "enabled", "budget_tokens": 1024})
            if turn % 2:
                with client.messages.stream(**kw) as events:
                    msg = events.get_final_message()
            else:
                msg = client.messages.create(**kw)
            kinds |= {b.type for b in msg.content}
            generated += msg.usage.output_tokens
            blocks = [b.model_dump(exclude_none=True) for b in msg.content
                      if keep_thinking or b.type != "thinking"]
            messages.append({"role": "assistant", "content": blocks})
            uses = [b for b in msg.content if b.type == "tool_use"]
            if uses:
                messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": u.id, "content": "42"} for u in uses]})
            else:
                messages.append({"role": "user", "content": "Check it once more."})
        (seg,) = _segments(server, sid)
        assert len(seg["step_ids"]) == 4 and {"thinking", "tool_use"} <= kinds
        _check_trajectory(seg, generated)
    finally:
        server.close()
        engine.stop()


def test_a_retried_turn_gets_the_same_message_and_records_nothing(proxy):
    h = {"X-Session-Id": "anthropic-turns-1", "X-Turn-Id": "t1", "Idempotency-Key": "k1"}
    msgs = [{"role": "user", "content": "Say a few words."}]
    full = httpx.post(proxy.url + "/v1/messages", headers={"X-Session-Id": "anthropic-turns-0"}, timeout=20,
                      json={"model": "m", "max_tokens": 40, "temperature": 0.5, "messages": msgs}).json()
    text = full["content"][0]["text"]
    body = {"model": "m", "max_tokens": 40, "temperature": 0.5, "messages": msgs, "stop_sequences": [text[4:6]]}
    first = httpx.post(proxy.url + "/v1/messages", headers=h, json=body, timeout=20).json()
    again = httpx.post(proxy.url + "/v1/messages", headers=h, json=body, timeout=20).json()
    assert first["stop_reason"] == "stop_sequence" and again == first   # a transport retry: replayed
    client = anthropic.Anthropic(base_url=proxy.url, api_key="dummy", max_retries=0, default_headers=h)
    with client.messages.stream(**{k: v for k, v in body.items() if k != "temperature"}, extra_body=T05) as events:
        replayed = events.get_final_message()
    assert replayed.model_dump(exclude_none=True) == anthropic.types.Message(**first).model_dump(exclude_none=True)
    assert httpx.get(proxy.url + "/sessions/anthropic-turns-1", timeout=20).json()["steps"] == 1
    # The same request under the same turn without a retry header generates again (a branch).
    plain = {k: v for k, v in h.items() if k != "Idempotency-Key"}
    other = httpx.post(proxy.url + "/v1/messages", headers=plain, json=body, timeout=20)
    assert other.status_code == 200 and other.json()["id"] != first["id"]
    assert httpx.get(proxy.url + "/sessions/anthropic-turns-1", timeout=20).json()["steps"] == 2
