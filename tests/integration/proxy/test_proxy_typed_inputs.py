"""Every input typed: a boolean or a string is not a number, only true / false is a flag, JSON the Proxy stores or parses is nested at most 64 levels
(tool-call arguments included), session metadata holds only what the journal and every answer format can
hold, and a read's ``session_ids`` are deduplicated and capped. Each refusal is a 400 naming the field,
with nothing created or recorded."""

from __future__ import annotations

import json

import httpx
import pytest

from dressage.proxy.json_values import MAX_DEPTH
from dressage.proxy.schemas import MAX_READ_SESSION_IDS

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def proxy(engine):
    from dressage.testing.stack import start_proxy

    with start_proxy(engine.url, r3=False) as stack:
        yield stack


def _sid(proxy, **kw) -> str:
    return httpx.post(proxy.url + "/sessions", **kw).json()["session_id"]


def _steps(proxy) -> int:
    return sum(len(s.steps) for s in proxy.service.core.sessions.values())


def _nested(depth: int) -> object:
    return json.loads("[" * depth + "]" * depth)


NOT_A_NUMBER, NOT_A_FLAG = "is not a number", "expected true or false"


@pytest.mark.parametrize("path, body, param, says", [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": True}, "max_tokens", NOT_A_NUMBER),
    ("/v1/chat/completions", {"messages": USER, "temperature": False}, "temperature", NOT_A_NUMBER),
    ("/v1/chat/completions", {"messages": USER, "n": True}, "n", NOT_A_NUMBER),
    ("/v1/completions", {"prompt": "hi", "max_tokens": True}, "max_tokens", NOT_A_NUMBER),
    ("/v1/completions", {"prompt": [True, 5]}, "prompt", NOT_A_NUMBER),
    ("/v1/responses", {"input": "hi", "max_output_tokens": True}, "max_output_tokens", NOT_A_NUMBER),
    ("/generate", {"input_ids": [1, True]}, "input_ids", NOT_A_NUMBER),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": "5"}, "max_tokens", NOT_A_NUMBER),
    ("/v1/chat/completions", {"messages": USER, "n": "2"}, "n", NOT_A_NUMBER),
    ("/v1/chat/completions", {"messages": USER, "seed": "1"}, "seed", NOT_A_NUMBER),
    ("/v1/chat/completions", {"messages": USER, "temperature": "NaN"}, "temperature", NOT_A_NUMBER),
    ("/v1/chat/completions", {"messages": USER, "instance_id": True}, "instance_id", NOT_A_NUMBER),
    ("/v1/completions", {"prompt": "hi", "seed": "1"}, "seed", NOT_A_NUMBER),
    ("/v1/responses", {"input": "hi", "max_output_tokens": "5"}, "max_output_tokens", NOT_A_NUMBER),
    ("/generate", {"input_ids": ["1", "2"]}, "input_ids", NOT_A_NUMBER),
    ("/v1/chat/completions", {"messages": USER, "stream": "true"}, "stream", NOT_A_FLAG),
    ("/v1/chat/completions", {"messages": USER, "stream": 1}, "stream", NOT_A_FLAG),
    ("/v1/chat/completions", {"messages": USER, "logprobs": "yes"}, "logprobs", NOT_A_FLAG),
    ("/v1/chat/completions", {"messages": USER, "parallel_tool_calls": "no"}, "parallel_tool_calls", NOT_A_FLAG),
    ("/v1/chat/completions", {"messages": USER, "stream_options": {"include_usage": "yes"}}, "stream_options",
     NOT_A_FLAG),
])
def test_a_boolean_or_a_string_is_not_a_number_and_only_true_or_false_is_a_flag(proxy, path, body, param, says):
    sid = _sid(proxy)
    before = _steps(proxy)
    r = httpx.post(f"{proxy.url}/sessions/{sid}{'' if path == '/generate' else '/v1'}"
                   f"{path.removeprefix('/v1')}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].split(".")[0] == param
    assert says in r.json()["error"]["message"]
    assert _steps(proxy) == before


@pytest.mark.parametrize("path, body, param", [
    ("/trajectory/read", {"drain": "yes"}, "drain"),
    ("/trajectory/read", {"lease": "yes"}, "lease"),
    ("/trajectory/read", {"lease": 1}, "lease"),
    ("/v1/rollout/resume", {"version": "7", "update_engines": "yes"}, "update_engines"),
    ("/v1/rollout/resume", {"version": "7", "update_engines": 1}, "update_engines"),
])
def test_a_control_call_takes_only_true_or_false_for_a_flag(proxy, path, body, param):
    before = httpx.get(proxy.url + "/v1/rollout/pause_state").json()
    r = httpx.post(proxy.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and NOT_A_FLAG in r.json()["error"]["message"]
    assert httpx.get(proxy.url + "/v1/rollout/pause_state").json() == before  # no version set
    assert proxy.service.trajectories.leases.open == {}  # no read handed anything out


def test_an_integral_number_written_with_a_fraction_is_that_integer(proxy):
    sid = _sid(proxy)
    r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions",
                   json={"messages": USER, "max_tokens": 2.0, "n": 2.0}, timeout=30)
    assert r.status_code == 200 and len(r.json()["choices"]) == 2, r.text


@pytest.mark.parametrize("reward", ["NaN", "inf", "-Infinity", "1e999", "1"])
def test_a_reward_that_is_a_string_is_refused_and_nothing_finalized(proxy, reward):
    sid = _sid(proxy)
    assert httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions", json={"messages": USER, "max_tokens": 2},
                      timeout=30).status_code == 200
    for path, body in ((f"/sessions/{sid}/finalize", {"reward": reward}),
                       ("/session/finalize", {"session_id": sid, "reward": reward})):
        r = httpx.post(proxy.url + path, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "reward", r.text
    assert proxy.service.core.session(sid).state == "active"


@pytest.mark.parametrize("metadata, why", [
    ({"group_index": "zzz"}, "group_index must be an integer"),
    ({"group_index": True}, "group_index must be an integer"),
    ({"group_index": 1.5}, "group_index must be an integer"),
    ({"instance_id": -1.5}, "instance_id must be a string or an integer"),
    ({"instance_id": {"a": 1}}, "instance_id must be a string or an integer"),
])
def test_the_prompt_groups_metadata_keys_are_typed_at_create(proxy, metadata, why):
    sessions = len(proxy.service.core.sessions)
    r = httpx.post(proxy.url + "/sessions", json={"metadata": metadata})
    assert r.status_code == 400 and r.json()["error"]["param"] == "metadata", r.text
    assert why in r.json()["error"]["message"]
    assert len(proxy.service.core.sessions) == sessions
    for ok in ({"group_index": 3}, {"instance_id": "p-7"}, {"instance_id": 7}):
        assert httpx.post(proxy.url + "/sessions", json={"metadata": ok}).status_code == 200


def test_a_misspelt_create_session_key_is_refused_not_dropped(proxy):
    sessions = len(proxy.service.core.sessions)
    r = httpx.post(proxy.url + "/sessions", json={"metdata": {"task": "t"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "metdata", r.text
    assert len(proxy.service.core.sessions) == sessions


def _deep_call(depth: int) -> dict:
    args = "{\"a\": " + "[" * depth + "]" * depth + "}"
    return {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": args}}


def test_tool_call_arguments_nested_too_deep_are_a_400_in_chat_and_responses(proxy):
    sid = _sid(proxy)
    chat = {"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [_deep_call(1000)]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "ok"}], "max_tokens": 4}
    r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions", json=chat, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages"
    assert "1.tool_calls.0.function.arguments" in err["message"] and f"deeper than {MAX_DEPTH}" in err["message"]

    items = [{"role": "user", "content": "hi"},
             {"type": "function_call", "call_id": "call_1", "name": "f",
              "arguments": _deep_call(1000)["function"]["arguments"]},
             {"type": "function_call_output", "call_id": "call_1", "output": "ok"}]
    r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/responses", json={"input": items}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "input" and "1.arguments" in r.json()["error"]["message"]
    assert len(proxy.service.core.session(sid).steps) == 0

    # Within the cap the same call goes through.
    chat["messages"][1]["tool_calls"] = [_deep_call(MAX_DEPTH - 2)]
    r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions", json=chat, timeout=30)
    assert r.status_code == 200, r.text


def test_tools_nested_too_deep_are_a_400(proxy):
    sid = _sid(proxy)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                         "default": _nested(200)}}}
    r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions",
                   json={"messages": USER, "tools": [tool], "max_tokens": 4}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text


SURROGATE_ARGS = '{"a": "\\ud800"}'  # a JSON text escaping a lone surrogate: the body itself is valid JSON


def _refused(proxy, sid: str, path: str, body: dict, param: str, code: str, **kw) -> dict:
    r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/{path}", json=body, timeout=30, **kw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error"), err
    assert len(proxy.service.core.session(sid).steps) == 0
    return err


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_arguments_escaping_a_lone_surrogate_are_a_400_in_chat_and_responses(proxy, stream):
    sid = _sid(proxy)
    chat = {"messages": [*USER, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": SURROGATE_ARGS}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "x"}], "max_tokens": 4, "stream": stream}
    err = _refused(proxy, sid, "chat/completions", chat, "messages[1].tool_calls[0].function.arguments",
                   "invalid_value")
    assert "lone UTF-16 surrogate (\\ud800)" in err["message"]
    items = [{"role": "user", "content": "hi"},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": SURROGATE_ARGS},
             {"type": "function_call_output", "call_id": "c1", "output": "x"}]
    _refused(proxy, sid, "responses", {"input": items, "max_output_tokens": 4, "stream": stream},
             "input[1].arguments", "invalid_value")
    # Arguments that are no JSON text are named as the Responses client sent them, not as chat messages.
    items[1]["arguments"] = "{bad"
    err = _refused(proxy, sid, "responses", {"input": items, "max_output_tokens": 4, "stream": stream},
                   "input[1].arguments", "invalid_value")
    assert "messages" not in err["message"]
    # A surrogate pair escaped in the arguments is one character: served.
    chat["messages"][1]["tool_calls"][0]["function"]["arguments"] = '{"a": "\\ud83d\\ude00"}'
    r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions", json=chat, timeout=30)
    assert r.status_code == 200, r.text


def test_anthropic_tool_use_input_holding_an_escaped_surrogate_text_is_served(proxy):
    # tool_use input is an object (the guard checked its strings); a backslash-u text in it is plain text.
    sid = _sid(proxy)
    body = {"model": "m", "max_tokens": 4, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": "\\ud800"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}]}
    r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/messages", json=body, timeout=30)
    assert r.status_code == 200, r.text


TOOL_FN = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("tools, param, code", [
    ([{"type": "function"}], "tools[0].function", "invalid_value"),
    ([{"type": "custom", "custom": {"name": "f"}}], "tools[0].type", "unsupported_parameter"),
    ([{"type": "web_search"}], "tools[0].type", "unsupported_parameter"),
    ([TOOL_FN, TOOL_FN], "tools[1].function.name", "invalid_value"),
    ([{"type": "function", "function": {"name": 5}}], "tools[0].function.name", "invalid_value"),
    ([{"type": "function", "function": {"name": "f", "parameters": "x"}}], "tools[0].function.parameters",
     "invalid_value"),
    ([{"type": "function", "function": {"name": 'a"b'}}], "tools[0].function.name", "invalid_value"),
    ([{"type": "function", "function": {"name": "a\nb"}}], "tools[0].function.name", "invalid_value"),
    ([{"type": "function", "function": {"name": ""}}], "tools[0].function.name", "invalid_value"),
])
@pytest.mark.parametrize("tool_choice", [None, "required"])
def test_chat_tools_that_cannot_be_served_as_sent_are_a_400_naming_the_tool(proxy, tools, param, code, tool_choice):
    sid = _sid(proxy)
    body = {"messages": USER, "tools": tools, "max_tokens": 64}
    if tool_choice:
        body["tool_choice"] = tool_choice
    _refused(proxy, sid, "chat/completions", body, param, code)


def test_anthropic_tools_follow_the_same_rules_in_anthropic_errors(proxy):
    sid = _sid(proxy)
    tool = {"name": "a b", "input_schema": {"type": "object"}}
    r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/messages", timeout=30,
                   json={"model": "m", "max_tokens": 4, "messages": USER, "tools": [tool]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["message"].startswith("tools[0].name: 'a b' cannot name a tool")
    assert len(proxy.service.core.session(sid).steps) == 0


@pytest.mark.parametrize("metadata, why", [
    ('{"deep": ' + "[" * 300 + "]" * 300 + "}", "deeper than"),
    ('{"deep": ' + "[" * 600 + "]" * 600 + "}", "deeper than"),
    ('{"big": 18446744073709551616}', "64-bit"),
    ('{"small": -9223372036854775809}', "64-bit"),
])
def test_metadata_nothing_can_store_is_refused_at_create(proxy, metadata, why):
    sessions = len(proxy.service.core.sessions)
    r = httpx.post(proxy.url + "/sessions", content='{"metadata": ' + metadata + "}",
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "metadata" and why in r.json()["error"]["message"]
    assert len(proxy.service.core.sessions) == sessions


def test_metadata_too_deep_to_parse_is_a_400_too(proxy):
    sessions = len(proxy.service.core.sessions)
    r = httpx.post(proxy.url + "/sessions", content='{"metadata": {"deep": ' + "[" * 990 + "]" * 990 + "}}",
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    assert len(proxy.service.core.sessions) == sessions


def test_metadata_within_the_limits_is_kept_and_read_back(proxy):
    metadata = {"deep": _nested(MAX_DEPTH - 1), "big": 2**63 - 1, "small": -(2**63), "f": 0.5, "s": "é"}
    sid = _sid(proxy, json={"metadata": metadata})
    r = httpx.get(f"{proxy.url}/sessions/{sid}")
    assert r.status_code == 200 and r.json()["metadata"] == metadata


def test_a_finalize_label_nothing_can_store_is_a_400(proxy):
    sid = _sid(proxy)
    r = httpx.post(f"{proxy.url}/sessions/{sid}/finalize", json={"label": {"x": 2**64}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "label", r.text
    assert proxy.service.core.session(sid).state == "active"


def test_read_session_ids_are_deduplicated_and_capped(proxy):
    sid = _sid(proxy)
    httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions", json={"messages": USER, "max_tokens": 2},
               timeout=30)
    assert httpx.post(f"{proxy.url}/sessions/{sid}/finalize", json={"reward": 1.0}).status_code == 200
    # 40,000 names of one session: one trajectory.
    named = [sid] * 40_000
    r = httpx.post(proxy.url + "/trajectory/read", json={"session_ids": named}, timeout=60)
    assert r.status_code == 200, r.text
    assert [d["session_id"] for d in r.json()["data"]] == [sid]
    too_many = [f"s{i}" for i in range(MAX_READ_SESSION_IDS + 1)]
    r = httpx.post(proxy.url + "/trajectory/read", json={"session_ids": too_many}, timeout=60)
    assert r.status_code == 422 and r.json()["error"]["param"] == "session_ids", r.text
    assert str(MAX_READ_SESSION_IDS) in r.json()["error"]["message"]


def test_an_empty_session_ids_reads_nothing_and_drains_nothing(proxy):
    sid = _sid(proxy)
    httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions", json={"messages": USER, "max_tokens": 2},
               timeout=30)
    assert httpx.post(f"{proxy.url}/sessions/{sid}/finalize", json={"reward": 1.0}).status_code == 200
    unread = httpx.get(proxy.url + "/trajectory/stats").json()["unread_trajectories"]
    assert unread >= 1
    r = httpx.post(proxy.url + "/trajectory/read", json={"session_ids": [], "drain": True}, timeout=30)
    assert r.status_code == 200, r.text
    assert (r.json()["mode"], r.json()["data"]) == ("trajectory", [])
    assert httpx.get(proxy.url + "/trajectory/stats").json()["unread_trajectories"] == unread
    assert sid in proxy.service.trajectories.finalized


@pytest.mark.parametrize("extra, param", [
    ({"lora_path": "my-adapter"}, "lora_path"), ({"image_data": "http://x/img.png"}, "image_data"),
    ({"text": "hello world"}, "text"), ({"custom_logit_processor": "xyz"}, "custom_logit_processor"),
    ({"stream": True}, "stream"), ({"not_an_sglang_field": 1}, "not_an_sglang_field"),
])
def test_a_generate_field_that_would_change_the_sample_is_refused_by_name(proxy, extra, param):
    sid = _sid(proxy)
    body = {"input_ids": [72, 105], "sampling_params": {"max_new_tokens": 3}, **extra}
    r = httpx.post(f"{proxy.url}/sessions/{sid}/generate", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert r.json()["error"]["code"] == "unsupported_parameter"
    assert len(proxy.service.core.session(sid).steps) == 0


def test_generate_bookkeeping_fields_are_accepted_and_ignored(proxy):
    sid = _sid(proxy)
    body = {"input_ids": [72, 105], "sampling_params": {"max_new_tokens": 3, "temperature": 0.0}}
    plain = httpx.post(f"{proxy.url}/sessions/{sid}/generate", json=body, timeout=30).json()
    extra = {"rid": "agent-1", "return_logprob": True, "top_logprobs_num": 2, "stream": False,
             "return_routed_experts": True, "priority": 3}
    r = httpx.post(f"{proxy.url}/sessions/{sid}/generate", json={**body, **extra}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == plain["output_ids"] and len(proxy.service.core.session(sid).steps) == 2


def test_a_pause_names_an_instance_as_a_string_or_an_integer(proxy):
    for instance in (5, "5"):
        r = httpx.post(proxy.url + "/v1/rollout/pause", json={"instance_id": instance}, timeout=30)
        assert r.status_code == 200, r.text
        assert httpx.post(proxy.url + "/v1/rollout/resume", json={}, timeout=30).status_code == 200
    r = httpx.post(proxy.url + "/v1/rollout/pause", json={"instance_id": True}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"].split(".")[0] == "instance_id", r.text


def test_samples_in_another_segment_view_are_refused_naming_segment_view(proxy):
    sid = _sid(proxy)
    httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions", json={"messages": USER, "max_tokens": 2},
               timeout=30)
    assert httpx.post(f"{proxy.url}/sessions/{sid}/finalize", json={"reward": 1.0}).status_code == 200
    own = proxy.service.core.config.segment_view
    other = "timeline" if own == "lineage" else "lineage"
    read = {"session_id": sid, "format": "samples"}
    r = httpx.post(proxy.url + "/trajectory/read", json={**read, "segment_view": other}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "segment_view", r.text
    assert f"or with {own!r}" in r.json()["error"]["message"]
    r = httpx.post(proxy.url + "/trajectory/read", json={**read, "segment_view": own}, timeout=30)
    assert r.status_code == 200 and r.json()["data"][0]["samples"], r.text


def test_a_null_responses_input_is_an_absent_one(proxy):
    sid = _sid(proxy)
    r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/responses",
                   json={"instructions": "be terse", "input": None, "max_output_tokens": 4}, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/responses", json={"input": None, "max_output_tokens": 4},
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text  # as with no input at all
