"""Responses <-> chat conversion, the response memory and the Responses event stream, without HTTP."""

import asyncio
import json

import pytest

from dressage.errors import InputValueError, UnknownResponseError, UnsupportedParameterError
from dressage.proxy.openai.chat.prompt import QwenToolCallParser, assistant_message, same_message
from dressage.proxy.openai.responses.protocol import (ResponseMemory, ResponsesRequest, chat_body, chat_tool_choice, chat_tools,
                                      conversation, input_messages, item_ids, output_items, response_object,
                                                      tool_namespaces)
from dressage.proxy.openai.responses.stream import ResponseEvents, replay_events, stream_response

CALL = '<tool_call>\n{"name": "calc", "arguments": {"a": 1}}\n</tool_call>'
REPLIES = [
    "Plain words, nothing else.",
    "Let me compute.\n" + CALL,
    CALL,
    CALL + "\n" + CALL.replace('"a": 1', '"a": 2') + " after",
    "<think>\nfirst I reason\n</think>\n\nThe answer is 42.",
    "<think>why</think>" + CALL,
    "<think>never closed, so all of it is content",
    "cut off <tool_call>\n{\"name\": \"calc\", \"argu",
]
CID = "chatcmpl-0123456789abcdef01234567"


def _completion(message, finish="stop"):
    return {"id": CID, "object": "chat.completion", "created": 7, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


def test_input_items_become_the_chat_messages_a_chat_client_sends():
    items = [{"role": "developer", "content": "rules"},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                              {"type": "input_text", "text": "b"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
             {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "one"},
             {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
             {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"}]
    assert input_messages(items) == [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "calling", "reasoning_content": "hm",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c3", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
    assert input_messages("hello") == [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("items, words", [
    ([{"type": "item_reference", "id": "x"}], "item_reference"),
    ([{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}], "input_image"),
    ([{"role": "tool", "content": "x"}], "role 'tool'"),
    ([{"type": "function_call", "name": "f"}], "call_id"),
    ([{"type": "function_call_output", "output": "x"}], "call_id"),
    ([{"type": "web_search_call", "id": "x"}], "web_search_call"),
])
def test_unsupported_input_is_a_typed_400(items, words):
    with pytest.raises(UnsupportedParameterError, match=words) as info:
        input_messages(items)
    assert info.value.http_status == 400 and info.value.code == "unsupported_parameter"


@pytest.mark.parametrize("arguments, words", [
    ("{bad", "is not a JSON text"),
    ('{"a": "\\ud800"}', "lone UTF-16 surrogate"),
    ('{"\\udfff": 1}', "lone UTF-16 surrogate"),
    (5, "must be a JSON text"),
])
def test_function_call_arguments_that_are_no_json_text_of_unicode_are_named_as_the_client_sent_them(arguments, words):
    items = [{"role": "user", "content": "hi"},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments},
             {"type": "function_call_output", "call_id": "c1", "output": "x"}]
    with pytest.raises(InputValueError, match=words) as info:
        input_messages(items)
    assert (info.value.param, info.value.code, info.value.http_status) == ("input[1].arguments", "invalid_value", 400)
    # An escaped surrogate pair is one character, and blank arguments read as none.
    items[1]["arguments"] = '{"a": "\\ud83d\\ude00"}'
    assert input_messages(items)[1]["tool_calls"][0]["function"]["arguments"] == '{"a": "\\ud83d\\ude00"}'
    items[1]["arguments"] = ""
    assert input_messages(items)[1]["tool_calls"][0]["function"]["arguments"] == "{}"


@pytest.mark.parametrize("text", REPLIES)
def test_output_items_sent_back_as_input_are_the_recorded_message(text):
    """What an agent sends back of a Response is, as chat, the recorded reply (so TITO continues)."""
    recorded = assistant_message(QwenToolCallParser(), text, call_id_prefix="call_x")
    items = output_items(recorded, CID)
    assert [i["type"] for i in items] == (["reasoning"] if "reasoning_content" in recorded else []) + (
        ["message"] if recorded.get("content") or not recorded.get("tool_calls") else []) + (
        ["function_call"] * len(recorded.get("tool_calls") or []))
    (back,) = input_messages(json.loads(json.dumps(items)))
    assert same_message(back, recorded)
    assert back.get("reasoning_content") == recorded.get("reasoning_content")
    assert [c["id"] for c in back.get("tool_calls") or []] == [c["id"] for c in recorded.get("tool_calls") or []]


def test_tools_and_tool_choice_convert_and_built_ins_are_refused():
    flat = [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True}]
    assert chat_tools(flat) == [{"type": "function", "function": {"name": "f", "description": "d",
                                                                  "parameters": {"type": "object"}, "strict": True}}]
    assert chat_tools(None) is None and chat_tools([]) is None
    for tool, param in (({"type": "web_search"}, "tools[0].type"), ({"type": "file_search"}, "tools[0].type"),
                        ({"type": "computer_use"}, "tools[0].type"),
                        ({"type": "custom", "name": "f"}, "tools[0].type")):
        with pytest.raises(UnsupportedParameterError) as info:
            chat_tools([tool])
        assert info.value.param == param and info.value.code == "unsupported_parameter"
    # Malformed function tools: the chat completions rules (dressage.proxy.function_tools), named as sent.
    for tool, param in (({"type": "function"}, "tools[0].name"), ({"type": "function", "name": 5}, "tools[0].name"),
                        ({"type": "function", "name": 'a"b'}, "tools[0].name"),
                        ({"type": "function", "name": "f", "parameters": "x"}, "tools[0].parameters")):
        with pytest.raises(InputValueError) as info:
            chat_tools([tool])
        assert info.value.param == param and info.value.code == "invalid_value"
    assert chat_tool_choice({"type": "function", "name": "f"}) == {"type": "function", "function": {"name": "f"}}
    assert [chat_tool_choice(c) for c in (None, "none", "auto", "required")] == [None, "none", "auto", "required"]
    for bad in ({"type": "file_search"}, {"type": "allowed_tools", "tools": []}, "sometimes"):
        with pytest.raises(UnsupportedParameterError):
            chat_tool_choice(bad)


NAMESPACE = {"type": "namespace", "name": "agents", "description": "Sub-agents.",
             "tools": [{"type": "function", "name": "spawn", "description": "Start one.", "strict": False,
                        "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}},
                       {"type": "function", "name": "close", "parameters": {"type": "object"}}]}


def test_namespace_tools_are_rendered_qualified_and_hosted_tools_are_refused_by_type():
    rendered = chat_tools([{"type": "function", "name": "shell"}, NAMESPACE])
    assert [t["function"]["name"] for t in rendered] == ["shell", "agents.spawn", "agents.close"]
    assert rendered[1]["function"] == {"name": "agents.spawn", "description": "Start one.\n\nSub-agents.",
                                       "strict": False, "parameters": NAMESPACE["tools"][0]["parameters"]}
    assert tool_namespaces([NAMESPACE]) == {"agents.spawn": ("agents", "spawn"), "agents.close": ("agents", "close")}
    for tools, param, words in (
            ([{"type": "mcp", "server_label": "x"}], "tools[0].type", "'mcp'"),
            ([{"type": "local_shell"}], "tools[0].type", "'local_shell'"),
            ([{"type": "image_generation"}], "tools[0].type", "'image_generation'"),
            ([{"type": "code_interpreter"}], "tools[0].type", "'code_interpreter'"),
            ([dict(NAMESPACE, tools=[{"type": "web_search"}])], "tools[0].tools[0].type", "'web_search'"),
            ([dict(NAMESPACE, tools=[])], "tools[0].tools", "list of function tools"),
            ([dict(NAMESPACE, name="a.b")], "tools[0].name", "without")):
        with pytest.raises(UnsupportedParameterError, match=words) as info:
            chat_tools(tools)
        assert info.value.param == param
    for tools, param, words in (
            ([NAMESPACE, NAMESPACE], "tools[1].tools[0].name", "'agents.spawn' is given twice"),
            ([{"type": "function", "name": "agents.close"}, NAMESPACE], "tools[1].tools[1].name",
             r"first at tools\[0\]\.name"),
            ([dict(NAMESPACE, name="a b")], "tools[0].name", "cannot name a namespace tool")):
        with pytest.raises(InputValueError, match=words) as info:
            chat_tools(tools)
        assert info.value.param == param
    assert chat_tool_choice({"type": "function", "name": "close", "namespace": "agents"}) == {
        "type": "function", "function": {"name": "agents.close"}}


def test_a_namespaced_call_is_answered_with_its_namespace_and_rendered_qualified_when_sent_back():
    text = '<think>go</think><tool_call>\n{"name": "agents.spawn", "arguments": {"task": "t"}}\n</tool_call>'
    recorded = assistant_message(QwenToolCallParser(), text, call_id_prefix="call_x")
    req = ResponsesRequest(input="x", tools=[{"type": "function", "name": "shell"}, NAMESPACE])
    response = response_object(req, _completion(recorded), completion_id=CID, created=7, model="m")
    (call,) = [i for i in response["output"] if i["type"] == "function_call"]
    assert (call["namespace"], call["name"], json.loads(call["arguments"])) == ("agents", "spawn", {"task": "t"})
    # The agent sends the call back (reasoning as Codex keeps it: a summary, no encrypted content) with its output.
    sent = [{"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "go"}],
             "encrypted_content": None},
            dict(call), {"type": "function_call_output", "call_id": call["call_id"], "namespace": "agents",
                         "output": "started"}]
    back, result = input_messages(sent)
    assert same_message(back, recorded) and back["reasoning_content"] == "go"
    assert back["tool_calls"][0]["function"]["name"] == "agents.spawn"
    assert result == {"role": "tool", "tool_call_id": call["call_id"], "content": "started"}
    # A plain function keeps its name and carries no namespace.
    plain = assistant_message(QwenToolCallParser(), text.replace("agents.spawn", "shell"), call_id_prefix="c")
    (item,) = output_items(plain, CID, namespaces=tool_namespaces(req.tools))[1:]
    assert item["name"] == "shell" and "namespace" not in item
    with pytest.raises(UnsupportedParameterError) as info:
        input_messages([dict(call, namespace=3)])
    assert info.value.param == "input[0].namespace"


def test_request_maps_to_the_chat_body_and_refuses_what_it_cannot_honour():
    req = ResponsesRequest(input="hi", instructions="sys", max_output_tokens=9, temperature=0.3, top_p=0.9,
                           tools=[{"type": "function", "name": "f"}], tool_choice="required", stream=True,
                           parallel_tool_calls=False)
    messages, n = conversation(req, [{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}])
    assert n == 1 and [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert chat_body(req, messages) == {
        "messages": messages, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
        "temperature": 0.3, "top_p": 0.9, "max_tokens": 9, "stream": True, "parallel_tool_calls": False}
    schema = {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}
    mapped = chat_body(ResponsesRequest(input="x", text={"format": schema}), messages)
    assert mapped["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "out", "schema": {"type": "object"}, "strict": True}}
    assert chat_body(ResponsesRequest(input="x", text={"format": {"type": "json_object"}}), messages)[
        "response_format"] == {"type": "json_object"}
    wants = chat_body(ResponsesRequest(input="x", include=["message.output_text.logprobs"], top_logprobs=2), messages)
    assert wants["logprobs"] is True and wants["top_logprobs"] == 2
    for bad, param in (({"background": True}, "background"), ({"reasoning": {"effort": "high", "x": 1}}, "reasoning"),
                       ({"reasoning": {"context": "all_turns"}}, "reasoning"),
                       ({"truncation": "auto"}, "truncation"), ({"conversation": "conv_1"}, "conversation"),
                       ({"text": {"verbosity": "low", "x": 1}}, "text"),
                       ({"prompt": {"id": "p"}}, "prompt"), ({"seed": 3}, "seed"), ({"stop": ["x"]}, "stop"),
                       ({"context_management": [{"type": "compaction"}]}, "context_management")):
        with pytest.raises(UnsupportedParameterError) as info:
            chat_body(ResponsesRequest(input="x", **bad), messages)
        assert info.value.param == param
    # Accepted as OpenAI clients send them by default.
    plain = chat_body(ResponsesRequest(input="x", include=[], reasoning={"effort": None}, truncation="disabled",
                                       text={"format": {"type": "text"}}, store=True, metadata={"k": "v"},
                                       user="u", service_tier="auto", prompt_cache_key="k", seed=None), messages)
    assert plain["response_format"] == {"type": "text"} and "logprobs" not in plain
    # What Codex sends on every call: none of it changes what is sampled.
    codex = chat_body(ResponsesRequest(
        input="x", client_metadata={"thread_id": "t"}, store=False, include=["reasoning.encrypted_content"],
        reasoning={"effort": "high", "summary": "auto"}, prompt_cache_key="k", parallel_tool_calls=True,
        text={"verbosity": "low"}, background=False, stream_options={"include_obfuscation": False},
        safety_identifier="s", prompt_cache_retention="24h"), messages)
    assert codex == {"messages": messages, "parallel_tool_calls": True, "stream": False}


def test_chat_logprobs_become_output_text_logprobs():
    lp = {"content": [{"token": "a", "logprob": -0.5, "bytes": [97],
                       "top_logprobs": [{"token": "a", "logprob": -0.5, "bytes": [97]},
                                        {"token": "b", "logprob": -1.5, "bytes": [98]}]}], "refusal": None}
    completion = _completion({"role": "assistant", "content": "a"})
    completion["choices"][0]["logprobs"] = lp
    resp = response_object(ResponsesRequest(input="x"), completion, completion_id=CID, created=7, model="m")
    (part,) = resp["output"][0]["content"]
    assert part["logprobs"] == [{"token": "a", "bytes": [97], "logprob": -0.5,
                                 "top_logprobs": [{"token": "a", "bytes": [97], "logprob": -0.5},
                                                  {"token": "b", "bytes": [98], "logprob": -1.5}]}]


def test_memory_is_bounded_per_session_copies_and_forgets():
    mem = ResponseMemory(per_session=2)
    for i in range(3):
        mem.remember("s", f"resp_{i}", [{"role": "user", "content": str(i)}])
    mem.remember("t", "resp_0", [{"role": "user", "content": "t"}])
    with pytest.raises(UnknownResponseError) as info:
        mem.recall("s", "resp_0")  # the oldest was dropped
    assert info.value.code == "previous_response_not_found" and info.value.http_status == 400
    got = mem.recall("s", "resp_2")
    got[0]["content"] = "changed"
    assert mem.recall("s", "resp_2") == [{"role": "user", "content": "2"}]
    assert mem.recall("t", "resp_0") == [{"role": "user", "content": "t"}] and len(mem) == 3
    mem.forget("s")
    with pytest.raises(UnknownResponseError):
        mem.recall("s", "resp_2")


def _events(frames):
    out = []
    for frame in frames:
        if frame.startswith(b":"):
            continue
        head, data = frame.decode().strip().split("\n", 1)
        body = json.loads(data[len("data: "):])
        assert head == f"event: {body['type']}"
        out.append(body)
    return out


def _run_stream(text, step, finish_reason="stop"):
    parser = QwenToolCallParser()
    req = ResponsesRequest(input="x")
    recorded = assistant_message(parser, text, call_id_prefix="call_x")

    async def gen():
        for end in range(step, len(text) + step, step):
            yield text[:end]
            if end == step:
                yield None  # a keep-alive
        yield _completion(recorded, finish_reason)

    def finish(completion, message_open):
        assert completion == _completion(recorded, finish_reason)
        return response_object(req, completion, completion_id=CID, created=7, model="m", keep_message=message_open)

    async def collect():
        skeleton = response_object(req, None, completion_id=CID, created=7, model="m")
        return [f async for f in stream_response(ResponseEvents(), skeleton, item_ids(CID), parser, gen(), finish)]

    return recorded, _events(asyncio.run(collect()))


@pytest.mark.parametrize("text", REPLIES)
@pytest.mark.parametrize("step", [1, 9])
def test_stream_events_add_up_to_the_final_response(text, step):
    recorded, events = _run_stream(text, step)
    kinds = [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["output_tokens"] == 5
    added = [(e["output_index"], e["item"]["id"]) for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert added == [(i, item["id"]) for i, item in enumerate(final["output"])]
    assert [e["item"] for e in done] == final["output"]
    for index, item in enumerate(final["output"]):
        mine = [e for e in events if e.get("output_index") == index]
        if item["type"] == "message":
            text_deltas = "".join(e["delta"] for e in mine if e["type"] == "response.output_text.delta")
            assert text_deltas.strip() == item["content"][0]["text"].strip()
            (text_done,) = [e for e in mine if e["type"] == "response.output_text.done"]
            assert text_done["text"] == item["content"][0]["text"]
        if item["type"] == "function_call":
            args = "".join(e["delta"] for e in mine if e["type"] == "response.function_call_arguments.delta")
            assert args == item["arguments"]
    # No delta leaks a tag or reasoning into the text.
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert "<tool_call>" not in streamed or "<tool_call>" in (recorded.get("content") or "")
    assert "<think>" not in streamed or "<think>" in (recorded.get("content") or "")
    # A retried turn replays the same final Response.
    replayed = _events(replay_events(final))
    assert replayed[-1]["response"] == final
    assert [e["item"] for e in replayed if e["type"] == "response.output_item.done"] == final["output"]


def test_text_is_streamed_before_the_reply_ends():
    _, events = _run_stream("A long plain reply that arrives in many chunks.", 4)
    kinds = [e["type"] for e in events]
    assert kinds.count("response.output_text.delta") > 5


def test_a_reply_cut_by_max_output_tokens_is_incomplete():
    _, events = _run_stream("cut here", 3, finish_reason="length")
    final = events[-1]
    assert final["type"] == "response.incomplete" and final["response"]["status"] == "incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
