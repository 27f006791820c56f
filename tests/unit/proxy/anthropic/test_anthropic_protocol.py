"""Messages <-> chat translation, Anthropic errors and the Messages event stream, without HTTP."""

import asyncio
import json

import pytest
from pydantic import ValidationError

from dressage.errors import (DressageError, InputValueError, NoHealthyEngineError, UnknownStepError,
                             UnsupportedParameterError)
from dressage.proxy.anthropic.protocol import (MessagesRequest, chat_body, chat_messages, chat_tool_choice, chat_tools,
                                               content_blocks, count_body, CountTokensRequest, dressage_error_object,
                                               error_object, invalid_body, is_anthropic_path, message_object,
                                               stop_reason)
from dressage.proxy.anthropic.stream import replay_message, stream_message
from dressage.proxy.openai.chat.prompt import QwenToolCallParser, assistant_message, same_message
from dressage.proxy.schemas import ChatRequest

CID = "chatcmpl-0123456789abcdef01234567"
CALL = '<tool_call>\n{"name": "calc", "arguments": {"a": 1}}\n</tool_call>'
REPLIES = [
    "Plain words, nothing else.",
    "Let me compute.\n" + CALL,
    CALL,
    CALL + "\n" + CALL.replace('"a": 1', '"a": 2'),
    "<think>\nfirst I reason\n</think>\n\nThe answer is 42.",
    "<think>why</think>" + CALL,
    "",
]


def _request(**kw):
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **kw}
    return MessagesRequest.model_validate(body)


def _completion(message, finish="stop"):
    return {"id": CID, "object": "chat.completion", "created": 7, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


# ------------------------------------------------------------------ request -> chat
def test_system_string_blocks_and_role_system_messages_make_one_system_turn():
    system = [{"type": "text", "text": "You are Claude.", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Be brief."}]
    messages = [{"role": "system", "content": "Environment: linux."},
                {"role": "user", "content": [{"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}]},
                {"role": "system", "content": [{"type": "text", "text": "Reminder."}]}]
    out = chat_messages(system, messages)
    assert out == [{"role": "system", "content": "You are Claude.\n\nBe brief.\n\nEnvironment: linux.\n\nReminder."},
                   {"role": "user", "content": "hello"}]
    assert chat_messages("Plain.", messages[1:2]) == [{"role": "system", "content": "Plain."},
                                                       {"role": "user", "content": "hello"}]
    assert chat_messages(None, messages[1:2]) == [{"role": "user", "content": "hello"}]


def test_tool_use_and_tool_results_as_string_or_blocks_become_tool_calls_and_tool_turns():
    messages = [{"role": "user", "content": "add"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Adding."},
                    {"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {"a": 1}},
                    {"type": "tool_use", "id": "toolu_2", "name": "calc", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "2"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                     "content": [{"type": "text", "text": "bad"}, {"type": "text", "text": "input"}]},
                    {"type": "text", "text": "go on"}]}]
    out = chat_messages(None, messages)
    assert out[1] == {"role": "assistant", "content": "Adding.",
                      "tool_calls": [{"id": "toolu_1", "type": "function",
                                      "function": {"name": "calc", "arguments": '{"a": 1}'}},
                                     {"id": "toolu_2", "type": "function",
                                      "function": {"name": "calc", "arguments": "{}"}}]}
    assert out[2:] == [{"role": "tool", "tool_call_id": "toolu_1", "content": "2"},
                       {"role": "tool", "tool_call_id": "toolu_2", "content": "bad\n\ninput"},
                       {"role": "user", "content": "go on"}]
    searched = chat_messages(None, [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "tool_reference", "tool_name": "Write"},
                                                                {"type": "text", "text": "loaded"}]}]}])
    assert searched == [{"role": "tool", "tool_call_id": "t", "content": "Write\n\nloaded"}]
    only_call = chat_messages(None, [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {"x": "y"}}]}])
    assert only_call[0]["content"] is None  # as a chat client sends a tool-only turn


def test_thinking_blocks_round_trip_as_reasoning_and_match_the_recorded_reply():
    parser = QwenToolCallParser()
    for text in REPLIES:
        recorded = assistant_message(parser, text, call_id_prefix="call_x")
        blocks = content_blocks(recorded, CID)
        sent_back = chat_messages(None, [{"role": "assistant", "content": blocks}])[0]
        assert same_message(recorded, sent_back), text
        assert sent_back.get("reasoning_content") == recorded.get("reasoning_content")
    redacted = chat_messages(None, [{"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "opaque"}, {"type": "text", "text": "ok"}]}])[0]
    assert redacted == {"role": "assistant", "content": "ok", "reasoning_content": "opaque"}


@pytest.mark.parametrize("block,where,word", [
    ({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
     "messages[0].content[0].type", "image"),
    ({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}},
     "messages[0].content[0].type", "document"),
    ({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]},
     "messages[0].content[0].content[0].type", "image"),
    ({"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
     "messages[0].content[0].type", "server_tool_use"),
])
def test_blocks_the_model_cannot_read_are_refused_by_name(block, where, word):
    with pytest.raises(UnsupportedParameterError) as err:
        chat_messages(None, [{"role": "user", "content": [block]}])
    assert err.value.param == where and word in str(err.value)


def test_tools_translate_and_server_tools_are_refused_by_name():
    tools = [{"name": "calc", "description": "evaluate", "input_schema": {"type": "object"},
              "cache_control": {"type": "ephemeral"}, "defer_loading": True},
             {"type": "custom", "name": "echo", "input_schema": {"type": "object", "properties": {}}}]
    assert chat_tools(tools) == [
        {"type": "function", "function": {"name": "calc", "description": "evaluate",
                                          "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "echo", "parameters": {"type": "object", "properties": {}}}}]
    for server in ({"type": "web_search_20250305", "name": "web_search"}, {"type": "bash_20250124", "name": "bash"}):
        with pytest.raises(UnsupportedParameterError) as err:
            chat_tools(tools + [server])
        assert err.value.param == "tools[2].type" and server["type"] in str(err.value)
    # Malformed tools: the rules of chat completions' function tools, named as the client sent them.
    for bad, param in (([{"name": "x"}], "tools[0].input_schema"),
                       ([{"name": "x", "input_schema": "s"}], "tools[0].input_schema"),
                       ([{"input_schema": {}}], "tools[0].name"),
                       ([{"name": "a\nb", "input_schema": {}}], "tools[0].name"),
                       (tools + [dict(tools[0], description="again")], "tools[2].name")):
        with pytest.raises(InputValueError) as err:
            chat_tools(bad)
        assert (err.value.param, err.value.code) == (param, "invalid_value")


def test_tool_choice_maps_onto_the_chat_rules():
    assert chat_tool_choice({"type": "auto"}) == ("auto", None)
    assert chat_tool_choice({"type": "any"}) == ("required", None)
    assert chat_tool_choice({"type": "any", "disable_parallel_tool_use": True}) == ("required", False)
    assert chat_tool_choice({"type": "tool", "name": "calc"}) == (
        {"type": "function", "function": {"name": "calc"}}, None)
    assert chat_tool_choice({"type": "none"}) == ("none", None)
    with pytest.raises(UnsupportedParameterError, match="tool_choice.type"):
        chat_tool_choice({"type": "sometimes"})


def test_chat_body_is_a_valid_chat_request_with_the_same_sampling():
    req = _request(system="S", temperature=0.5, top_p=0.9, top_k=20, stop_sequences=["END"], stream=True,
                   tools=[{"name": "calc", "input_schema": {"type": "object"}}],
                   tool_choice={"type": "tool", "name": "calc", "disable_parallel_tool_use": True},
                   thinking={"type": "enabled", "budget_tokens": 1024}, metadata={"user_id": "u"},
                   context_management={"edits": []}, output_config={"effort": "high"}, service_tier="auto",
                   container=None, mcp_servers=[])
    chat = ChatRequest.model_validate(chat_body(req))
    assert chat.max_tokens == 64 and chat.temperature == 0.5 and chat.top_p == 0.9 and chat.top_k == 20
    assert chat.stop == ["END"] and chat.stream is True and chat.parallel_tool_calls is False
    assert chat.tool_choice == {"type": "function", "function": {"name": "calc"}}
    assert [m.model_dump(exclude_none=True) for m in chat.messages] == [{"role": "system", "content": "S"},
                                                                         {"role": "user", "content": "hi"}]
    assert not chat.model_extra  # nothing the chat policy would refuse
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    fmt = chat_body(_request(output_config={"format": {"type": "json_schema", "schema": schema}}))
    assert fmt["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    older = chat_body(_request(output_format={"type": "json_schema", "schema": schema}))  # the beta's name
    assert older["response_format"] == fmt["response_format"]
    kept = chat_body(_request(fallbacks=[{"model": "other"}], context_management={"edits": [
        {"type": "clear_thinking_20251015", "keep": "all"}]}))  # nothing that changes the reply
    assert kept["messages"] == fmt["messages"]


@pytest.mark.parametrize("extra,name", [({"frequency_penalty": 0.5}, "frequency_penalty"),
                                        ({"logprobs": True}, "logprobs"),
                                        ({"mcp_servers": [{"type": "url", "url": "http://x"}]}, "mcp_servers"),
                                        ({"output_config": {"format": {"type": "xml"}}}, "output_config.format"),
                                        ({"output_format": {"type": "xml"}}, "output_format"),
                                        ({"container": "c-1"}, "container"), ({"compaction": {}}, "compaction"),
                                        ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
                                         "context_management.edits[0]")])
def test_unknown_or_unservable_fields_are_refused_by_name(extra, name):
    with pytest.raises(UnsupportedParameterError) as err:
        chat_body(_request(**extra))
    assert err.value.param == name


def test_missing_max_tokens_names_the_field():
    with pytest.raises(ValidationError) as err:
        MessagesRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    exc = invalid_body(err.value)
    assert exc.param == "max_tokens" and str(exc) == "max_tokens: Field required"
    assert error_object(400, str(exc)) == {"type": "error", "error": {"type": "invalid_request_error",
                                                                      "message": "max_tokens: Field required"}}


def test_count_body_takes_the_request_without_max_tokens():
    req = CountTokensRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "system": "s",
                                             "thinking": {"type": "adaptive"}})
    messages, tools, choice = count_body(req)
    assert messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "x"}]
    assert tools is None and choice is None


# ------------------------------------------------------------------ chat -> Message
def test_message_object_blocks_stop_reasons_and_usage():
    parser = QwenToolCallParser()
    msg = assistant_message(parser, "<think>plan</think>Let me compute.\n" + CALL, call_id_prefix="call_x")
    out = message_object(_completion(msg, "tool_calls"), model="claude-x", matched=None)
    assert out["id"] == "msg_0123456789abcdef01234567" and out["type"] == "message" and out["model"] == "claude-x"
    assert out["content"] == [{"type": "thinking", "thinking": "plan", "signature": "dressage"},
                              {"type": "text", "text": "Let me compute."},
                              {"type": "tool_use", "id": "toolu_0123456789abcdef01234567_0", "name": "calc",
                               "input": {"a": 1}}]
    assert out["stop_reason"] == "tool_use" and out["stop_sequence"] is None
    assert out["usage"] == {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": 0}
    assert [stop_reason("length", None), stop_reason("stop", None), stop_reason("stop", "END")] == [
        "max_tokens", "end_turn", "stop_sequence"]
    plain = message_object(_completion({"role": "assistant", "content": ""}), model="m", matched="END")
    assert plain["content"] == [{"type": "text", "text": ""}] and plain["stop_sequence"] == "END"


def test_errors_take_anthropic_types_by_status():
    assert dressage_error_object(UnknownStepError("session x not found"))["error"]["type"] == "not_found_error"
    assert dressage_error_object(NoHealthyEngineError("none"))["error"]["type"] == "overloaded_error"
    assert dressage_error_object(DressageError("boom"))["error"]["type"] == "api_error"
    assert is_anthropic_path("/sessions/s/v1/messages") and is_anthropic_path("/v1/messages/count_tokens")
    assert not is_anthropic_path("/v1/chat/completions")


# ------------------------------------------------------------------ event stream
def _events(frames):
    out = []
    for frame in frames:
        text = frame.decode()
        head, data = text.split("\n", 1)
        assert head.startswith("event: ") and text.endswith("\n\n")
        body = json.loads(data[len("data: "):])
        assert body["type"] == head[len("event: "):]
        out.append(body)
    return out


def _accumulate(events):
    """The Message a client builds from the events (as the SDKs' accumulators do)."""
    message = None
    for ev in events:
        if ev["type"] == "message_start":
            message = ev["message"]
        elif ev["type"] == "content_block_start":
            assert ev["index"] == len(message["content"])
            message["content"].append(dict(ev["content_block"]))
        elif ev["type"] == "content_block_delta":
            block, delta = message["content"][ev["index"]], ev["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "input_json_delta":
                block["_json"] = block.get("_json", "") + delta["partial_json"]
        elif ev["type"] == "content_block_stop":
            block = message["content"][ev["index"]]
            if block["type"] == "tool_use":
                block["input"] = json.loads(block.pop("_json"))
        elif ev["type"] == "message_delta":
            message.update(ev["delta"])
            message["usage"]["output_tokens"] = ev["usage"]["output_tokens"]
    return message


@pytest.mark.parametrize("text", REPLIES)
def test_streamed_blocks_add_up_to_the_non_streamed_message(text):
    parser = QwenToolCallParser()
    recorded = assistant_message(parser, text, call_id_prefix="call_x")
    completion = _completion(recorded, "tool_calls" if recorded.get("tool_calls") else "stop")
    final = message_object(completion, model="m", matched=None)
    skeleton = dict(final, content=[], stop_reason=None, usage=dict(final["usage"], output_tokens=0))

    async def events():
        for k in range(1, len(text) + 1, 3):
            yield text[:k]
        yield None
        yield completion

    async def run():
        return [f async for f in stream_message(skeleton, parser, events(), lambda c: message_object(
            c, model="m", matched=None))]

    evs = _events(asyncio.run(run()))
    kinds = [e["type"] for e in evs]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert evs[0]["message"]["content"] == [] and evs[0]["message"]["usage"]["input_tokens"] == 10
    assert _accumulate(evs) == final
    if "Plain" in text:
        assert kinds.count("content_block_delta") > 2  # the text went out as it came
    assert _accumulate(_events(replay_message(final))) == final


# ------------------------------------------------------------------ a failure inside an open stream
def test_a_stream_that_fails_after_it_began_ends_with_an_error_event():
    from types import SimpleNamespace

    import numpy as np

    from dressage.errors import EngineTimeout
    from dressage.proxy.anthropic.serving import MessageShaper, MessagesServing
    from dressage.proxy.openai.chat.serving import ChatServing
    from dressage.proxy.recording.lifecycle import InFlight

    async def generate(plan):
        yield "Some words"
        raise EngineTimeout("the engine did not answer within 5s")

    book = SimpleNamespace(failed_calls=0, dropped=[], failures=[])
    book.drop_if_unused = lambda sid, own_calls=0: book.dropped.append(sid)

    def failed(exc):
        book.failed_calls += 1
        book.failures.append(type(exc).__name__)

    book.failed = failed
    in_flight = InFlight()
    chat = ChatServing(None, None, None, calls=SimpleNamespace(generate=generate), sampler=None, turns=None,
                       limits=None, in_flight=in_flight, book=book)
    messages = MessagesServing(None, None, None, chat=chat, parser=QwenToolCallParser(), book=book)
    call = SimpleNamespace(session_id="s1", completion_id=CID, prompt=SimpleNamespace(prompt_ids=np.arange(7)),
                           turn_id=None, cached=False, retry=False, buffered=False, plan=None,
                           options=SimpleNamespace(stops=()))

    async def run():
        return [f async for f in chat._stream(call, MessageShaper(messages, "m"))]

    evs = _events(asyncio.run(run()))
    assert [e["type"] for e in evs][:2] == ["message_start", "ping"]
    assert evs[0]["message"]["usage"]["input_tokens"] == 7
    assert any(e["type"] == "content_block_delta" and e["delta"].get("text") == "Some words" for e in evs)
    # The agent is told what an OpenAI client is told (the whole message goes to the Proxy's log).
    assert evs[-1] == {"type": "error", "error": {"type": "api_error", "message": EngineTimeout.public_message}}
    assert book.failed_calls == 1 and book.failures == ["EngineTimeout"] and book.dropped == ["s1"]  # nothing was committed: a fresh session goes
    assert in_flight.running("s1") == 0  # the call is no longer in flight


def test_a_last_assistant_message_a_prefill_is_refused_naming_it():
    prefill = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, here is"}]
    with pytest.raises(UnsupportedParameterError) as err:
        chat_body(_request(messages=prefill))
    assert err.value.param == "messages[1]" and "prefill" in str(err.value)
    # An empty or blank one prefills nothing: served as the conversation it is.
    assert chat_body(_request(messages=[prefill[0], {"role": "assistant", "content": " "}]))
