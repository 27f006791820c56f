"""Chat parameters -> SGLang sampling params, the Proxy's tool rules, stop trimming, logprob shape."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from dressage.errors import InputValueError, UnsupportedParameterError
from dressage.proxy.openai.chat.prompt import QwenToolCallParser, assistant_message
from dressage.proxy.openai.chat.params import chat_messages, chat_options
from dressage.proxy.openai.chat.reply import cut_at_stop, openai_logprobs, visible_prefix
from dressage.proxy.schemas import ChatRequest

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}},
         {"type": "function", "function": {"name": "g", "parameters": {}}}]


def _req(**kw):
    return ChatRequest(messages=kw.pop("messages", [{"role": "user", "content": "x"}]), **kw)


def _call(name):
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": "{}"}}


def test_sampling_params_use_sglang_names():
    o = chat_options(_req(frequency_penalty=0.1, presence_penalty=0.2, repetition_penalty=1.2, top_k=5, min_p=0.1,
                          min_tokens=3, temperature=0.5, top_p=0.7, stop="END", logit_bias={"7": 5},
                          response_format={"type": "json_object"}))
    assert o.sampling == {"frequency_penalty": 0.1, "presence_penalty": 0.2, "repetition_penalty": 1.2, "top_k": 5,
                          "min_p": 0.1, "min_new_tokens": 3, "temperature": 0.5, "top_p": 0.7, "stop": ["END"],
                          "logit_bias": {"7": 5.0}, "json_schema": '{"type": "object"}'}
    assert o.stops == ("END",) and not o.constrained
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    o = chat_options(_req(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}))
    assert json.loads(o.sampling["json_schema"]) == schema
    assert chat_options(_req(response_format={"type": "text"})).sampling == {}


@pytest.mark.parametrize("kw,param", [
    ({"logit_bias": {"tok": 1}}, "logit_bias"), ({"logit_bias": {"3": 101}}, "logit_bias"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tool_choice": "required"}, "tool_choice"), ({"top_logprobs": 2}, "top_logprobs"),
    ({"audio": {"voice": "x"}}, "audio"), ({"logit_bias_typo": 1}, "logit_bias_typo"),
])
def test_refusals_name_the_parameter(kw, param):
    with pytest.raises(UnsupportedParameterError) as info:
        chat_options(_req(**kw))
    assert info.value.param == param and info.value.http_status == 400


@pytest.mark.parametrize("tools, param", [
    ([{"type": "custom", "custom": {"name": "f"}}], "tools[0].type"),
    ([{"type": "web_search"}], "tools[0].type"),
    ([TOOLS[0], {"type": "file_search"}], "tools[1].type"),
])
def test_a_tool_type_other_than_function_is_refused_by_name(tools, param):
    with pytest.raises(UnsupportedParameterError) as info:
        chat_options(_req(tools=tools))
    assert (info.value.param, info.value.code, info.value.http_status) == (param, "unsupported_parameter", 400)


@pytest.mark.parametrize("tools, param, words", [
    ([{"type": "function"}], "tools[0].function", "function"),
    ([{"type": "function", "function": {"name": 5}}], "tools[0].function.name", "needs a name"),
    ([{"type": "function", "function": {"name": ""}}], "tools[0].function.name", "needs a name"),
    ([{"type": "function", "function": {"name": 'a"b'}}], "tools[0].function.name", "letters, digits"),
    ([{"type": "function", "function": {"name": "a\nb"}}], "tools[0].function.name", "letters, digits"),
    ([{"type": "function", "function": {"name": "<f>"}}], "tools[0].function.name", "letters, digits"),
    ([{"type": "function", "function": {"name": "f", "parameters": "x"}}], "tools[0].function.parameters",
     "JSON Schema object"),
    ([{"type": "function", "function": {"name": "f", "description": 5}}], "tools[0].function.description", "string"),
    ([{"type": "function", "function": {"name": "f", "strict": "yes"}}], "tools[0].function.strict", "true or false"),
    ([*TOOLS, TOOLS[0]], "tools[2].function.name", "'f' is given twice (first at tools[0].function.name)"),
])
def test_a_malformed_tool_is_invalid_value_naming_its_field(tools, param, words):
    for choice in (None, "required"):
        with pytest.raises(InputValueError, match=re.escape(words)) as info:
            chat_options(_req(tools=tools, tool_choice=choice))
        assert (info.value.param, info.value.code, info.value.http_status) == (param, "invalid_value", 400)


def test_well_formed_tools_pass_as_sent():
    tools = [{"function": {"name": "read_file", "description": "d", "parameters": {"type": "object"}, "strict": True}},
             {"type": "function", "function": {"name": "mcp__ide.get-diagnostics_2"}},
             {"type": "function", "function": {"name": "天气"}}]
    assert chat_options(_req(tools=tools, tool_choice="required")).tool_mode == "required"
    assert _req(tools=tools).tools == tools  # validated, not rewritten: the template renders them as sent


def _history(arguments):
    return [{"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [_call("f"), {"id": "c2", "type": "function",
                                                             "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c", "content": "x"}]


@pytest.mark.parametrize("arguments, words", [
    ('{"a": "\\ud800"}', "lone UTF-16 surrogate (\\ud800)"),
    ('["\\uDC00"]', "lone UTF-16 surrogate (\\udc00)"),
    ("{bad", "is not a JSON text"),
    (["a"], "must be a JSON text"),
])
def test_tool_call_arguments_must_be_a_json_text_of_unicode_text(arguments, words):
    with pytest.raises(InputValueError, match=re.escape(words)) as info:
        chat_messages(_req(messages=_history(arguments)))
    assert (info.value.param, info.value.code) == ("messages[1].tool_calls[1].function.arguments", "invalid_value")


@pytest.mark.parametrize("arguments", ['{"a": "\\ud83d\\ude00"}', '{"a": "\\\\ud800"}', "", None, {"a": 1}])
def test_tool_call_arguments_that_are_unicode_json_pass(arguments):
    assert chat_messages(_req(messages=_history(arguments)))[1]["tool_calls"][1]["function"].get("arguments") == \
        arguments


def test_no_op_parameters_pass():
    o = chat_options(_req(user="u", metadata={"a": "b"}, store=True, service_tier="auto", prediction={"type": "content"},
                          modalities=["text"], audio=None))
    assert o.sampling == {}


def test_tool_rules():
    required = chat_options(_req(tools=TOOLS, tool_choice="required"))
    named = chat_options(_req(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "g"}}))
    single = chat_options(_req(tools=TOOLS, parallel_tool_calls=False))
    plain = {"role": "assistant", "content": "hi"}
    assert "called no tool" in required.violation(plain) and required.violation({"tool_calls": [_call("f")]}) is None
    assert "called f" in named.violation({"tool_calls": [_call("g"), _call("f")]})
    assert named.violation({"tool_calls": [_call("g")]}) is None and "no tool" in named.violation(plain)
    assert "2 calls" in single.violation({"tool_calls": [_call("f"), _call("g")]})
    assert single.violation(plain) is None and all(o.constrained for o in (required, named, single))
    assert not chat_options(_req(tools=TOOLS, parallel_tool_calls=True)).constrained


def test_sample_seeds():
    one = chat_options(_req(seed=7))
    assert one.sample_seed(0, 0) == 7 and one.sample_seed(0, 1) == 8
    group = chat_options(_req(seed=7, n=3))
    assert [group.sample_seed(i, 0) for i in range(3)] == [7, 8, 9] and group.sample_seed(0, 1) == 10
    assert chat_options(_req()).sample_seed(0, 0) is None
    unseeded = chat_options(_req(n=4))
    assert len({unseeded.sample_seed(i, 0) for i in range(4)}) == 4


def test_messages_developer_and_parts():
    msgs = chat_messages(_req(messages=[{"role": "developer", "content": "rules"},
                                        {"role": "user", "content": [{"type": "text", "text": "a"}]}]))
    assert msgs[0] == {"role": "system", "content": "rules"} and msgs[1]["content"] == [{"type": "text", "text": "a"}]
    for part in ({"type": "input_audio", "input_audio": {}}, {"type": "file", "file": {}}, {"text": "no type"}):
        with pytest.raises(UnsupportedParameterError) as info:
            chat_messages(_req(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, part]}]))
        assert info.value.param == "messages[0].content[1]"


def test_stop_cut_and_stream_holdback():
    assert cut_at_stop("abc STOP def END", ["END", "STOP"]) == ("abc ", True)
    assert cut_at_stop("abc", ["x"]) == ("abc", False)
    assert visible_prefix("hello ST", ["STOP"]) == "hello "
    assert visible_prefix("hello STOP more", ["STOP"]) == "hello "
    assert visible_prefix("hello S", ["SX", "STOP"]) == "hello "
    assert visible_prefix("hello", ["STOP"]) == "hello" and visible_prefix("hello", []) == "hello"


def test_tool_choice_none_parses_no_call():
    text = '<think>hm</think>Sure <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    with_calls = assistant_message(QwenToolCallParser(), text, call_id_prefix="c")
    without = assistant_message(QwenToolCallParser(), text, call_id_prefix="c", tool_calls=False)
    assert with_calls["tool_calls"][0]["function"]["name"] == "f"
    assert "tool_calls" not in without and without["content"].startswith("Sure <tool_call>")
    assert without["reasoning_content"] == "hm"


def test_openai_logprob_shape():
    ids = np.array([72, 105, 258], np.int32)
    lps = np.array([-0.5, -1.0, -0.1], np.float32)
    top = [[[-0.5, 72, None], [-2.0, 73, None]], [[-0.7, 111, None], [-1.0, 105, None]], [[-0.1, 258, None]]]
    names = {72: "H", 73: "I", 105: "i", 111: "o", 258: "<|im_end|>"}
    out = openai_logprobs(ids, lps, top, names.__getitem__, 2)
    assert out["refusal"] is None and [e["token"] for e in out["content"]] == ["H", "i", "<|im_end|>"]
    first = out["content"][0]
    assert first == {"token": "H", "logprob": -0.5, "bytes": [72],
                     "top_logprobs": [{"token": "H", "logprob": -0.5, "bytes": [72]},
                                      {"token": "I", "logprob": -2.0, "bytes": [73]}]}
    assert openai_logprobs(ids, lps, None, names.__getitem__, 0)["content"][1]["top_logprobs"] == []


def test_null_parameters_are_their_defaults():
    req = ChatRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "n": None, "stream": None,
                                      "temperature": None, "stop": None, "tools": None, "logprobs": None})
    assert req.n == 1 and req.stream is False
    assert chat_options(req).sampling == {}
