"""Each tool-call / reasoning parser family reads back what its model's template writes, whole
and streamed in any chunking, and never streams text that turns out to be part of a call."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.errors import ConfigError
from dressage.proxy.openai.streaming import ContentStream
from dressage.proxy.parsers import assistant_message, default_parsers, make_parser
from dressage.proxy.parsers.qwen_xml import render_xml_call

from parser_replies import CALLS, FAMILIES, TOOLS, json_call_text as _json, render as _render


def _parser(family):
    return make_parser(family)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_reads_back_its_templates_calls_typed_by_the_schema(family):
    text = _render(family, CALLS)
    msg = assistant_message(_parser(family), text, call_id_prefix="c", tools=TOOLS)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == CALLS
    assert msg["reasoning_content"] == "I think so."
    assert msg["content"] == (None if family == "gpt-oss" else "Let me check.")
    ids = [c["id"] for c in msg["tool_calls"]]
    assert ids == (["functions.get_weather:0", "functions.search:1"] if family == "kimi_k2" else ["c_0", "c_1"])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_reply_without_calls_is_content_and_a_malformed_call_stays_content(family):
    parser = _parser(family)
    plain = _render(family, [], content="Just text.")
    msg = assistant_message(parser, plain if family != "gpt-oss" else plain + "<|start|>assistant<|channel|>final"
                            "<|message|>Just text.<|return|>", call_id_prefix="c", tools=TOOLS)
    assert "tool_calls" not in msg and msg["content"].strip() == "Just text."
    broken = _render(family, [("search", {"q": "x"})]).replace('{"q": "x"}', '{"q": ')
    if family in ("qwen3_coder", "glm45", "glm47"):
        broken = _render(family, [("search", {"q": "x"})]).replace("</parameter>", "").replace("</arg_value>", "")
    msg = assistant_message(parser, broken, call_id_prefix="c", tools=TOOLS)
    assert "tool_calls" not in msg


def test_without_tool_calls_call_text_stays_in_the_content():
    text = _render("qwen3_coder", CALLS[:1])
    msg = assistant_message(make_parser("qwen3_coder"), text, call_id_prefix="c", tool_calls=False)
    assert "tool_calls" not in msg and "<function=get_weather>" in msg["content"]
    assert msg["reasoning_content"] == "I think so."


def test_xml_values_without_a_schema_stay_strings_and_bad_typed_values_stay_raw():
    text = render_xml_call("other", {"n": "5", "flag": "true"}) + render_xml_call("get_weather", {"days": "many"})
    msg = assistant_message(make_parser("qwen3_coder"), text, call_id_prefix="c", tools=TOOLS)
    assert [json.loads(c["function"]["arguments"]) for c in msg["tool_calls"]] == [{"n": "5", "flag": "true"},
                                                                                  {"days": "many"}]


def test_the_xml_family_reads_hermes_json_calls_too():
    text = f"<tool_call>\n{_json('search', {'q': 'a'})}\n</tool_call>"
    msg = assistant_message(make_parser("qwen3_coder"), text, call_id_prefix="c", tools=TOOLS)
    assert msg["tool_calls"][0]["function"] == {"name": "search", "arguments": '{"q": "a"}'}


def test_harmony_final_channel_is_the_content():
    text = ("<|channel|>analysis<|message|>think first<|end|><|start|>assistant<|channel|>final<|message|>"
            "The answer.<|return|>")
    msg = assistant_message(make_parser("gpt-oss"), text, call_id_prefix="c")
    assert msg == {"role": "assistant", "content": "The answer.", "reasoning_content": "think first"}


@pytest.mark.parametrize("names, expected", [
    (("Qwen/Qwen3.6-35B-A3B",), ("qwen3_coder", "qwen3")), (("qwen3.6-35b-a3b",), ("qwen3_coder", "qwen3")),
    (("Qwen/Qwen3-Coder-30B-A3B-Instruct",), ("qwen3_coder", "qwen3")), (("Qwen3-8B",), ("qwen", "qwen3")),
    (("zai-org/GLM-4.6",), ("glm45", "glm45")), (("glm-5.2-744b-a40b",), ("glm47", "glm45")),
    (("deepseek-ai/DeepSeek-V3.1",), ("deepseekv31", "deepseek-v3")),
    (("deepseek-ai/DeepSeek-V3-0324",), ("deepseekv3", "deepseek-r1")),
    (("moonshotai/Kimi-K2-Instruct",), ("kimi_k2", "kimi_k2")), (("openai/gpt-oss-20b",), ("gpt-oss", "gpt-oss")),
    (("tiny-moe",), ("qwen", "qwen3")), ((None, "GLM-4.7"), ("glm47", "glm45")), (("THUDM/GLM-4.5-Air",), ("glm45", "glm45")),
    (("tiny-moe", "gpt-oss-120b"), ("gpt-oss", "gpt-oss")),
])
def test_the_default_parsers_follow_the_served_model_name(names, expected):
    assert default_parsers(*names) == expected


def test_an_unknown_parser_name_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="'nope'"):
        make_parser("nope")
    with pytest.raises(ConfigError, match="'nah'"):
        make_parser("qwen", "nah")


def _chunks(text, cuts):
    points = sorted({min(c, len(text)) for c in cuts} | {len(text)})
    return [text[:p] for p in points]


def _stream(parser, prefixes, final_text):
    cs = ContentStream(parser, call_id_prefix="c", tools=TOOLS)
    shown = []
    for prefix in prefixes:
        for delta in cs.feed(prefix):
            shown.append(delta)
    message = assistant_message(parser, final_text, call_id_prefix="c", tools=TOOLS)
    streamed_before_end = "".join(d.get("content", "") for d in shown)
    early_calls = [c for d in shown for c in d.get("tool_calls", ())]
    shown.extend(cs.finish(message))
    return message, shown, streamed_before_end, early_calls


@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from(FAMILIES), n_calls=st.integers(0, 2), cuts=st.lists(st.integers(0, 600), max_size=25))
def test_streamed_in_any_chunking_the_deltas_add_up_to_the_message_and_never_show_call_text(family, n_calls, cuts):
    parser = _parser(family)
    text = _render(family, CALLS[:n_calls], content="Here it is: a < b and c.")
    if family == "gpt-oss" and not n_calls:
        text += "<|start|>assistant<|channel|>final<|message|>Here it is: a < b and c.<|return|>"
    message, shown, early, early_calls = _stream(parser, _chunks(text, cuts), text)
    content = "".join(d.get("content", "") for d in shown)
    assert content.strip() == (message["content"] or "").strip()
    assert [d["reasoning_content"] for d in shown if "reasoning_content" in d] == [message["reasoning_content"]]
    calls = [c for d in shown for c in d.get("tool_calls", ())]
    final = message.get("tool_calls", [])
    assert [(c["index"], c["id"], c["function"]) for c in calls] == [(i, c["id"], c["function"])
                                                                      for i, c in enumerate(final)]
    # A call streams once complete: fed its whole text, each call went out before the end.
    whole, _, _, whole_calls = _stream(parser, [text], text)
    assert len(whole_calls) == len(final) and len(early_calls) <= len(final)
    for marker in ("<tool_call", "<｜tool", "<|tool", "<|channel", "<|start", "functions.", "<think", "</think"):
        assert marker not in early


def test_the_server_settings_refuse_an_unknown_parser_by_its_key():
    from dressage.proxy.config import ServerConfig

    with pytest.raises(ConfigError, match="server.tool_call_parser"):
        ServerConfig(tool_call_parser="nope")
    with pytest.raises(ConfigError, match="server.reasoning_parser"):
        ServerConfig(reasoning_parser="nope")
    assert ServerConfig(tool_call_parser="glm45").tool_call_parser == "glm45"


def test_harmony_reads_a_call_whose_end_token_was_left_out_but_does_not_stream_it_early():
    parser = make_parser("gpt-oss")
    text = ("<|channel|>analysis<|message|>need data<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.search <|constrain|>json<|message|>{"q": "x"}')  # <|call|> is the end-of-turn token
    msg = assistant_message(parser, text, call_id_prefix="c")
    assert msg["tool_calls"][0]["function"] == {"name": "search", "arguments": '{"q": "x"}'}
    assert parser.stream_calls(text, call_id_prefix="c") == []
    assert len(parser.stream_calls(text + "<|call|>", call_id_prefix="c")) == 1


def test_families_whose_markers_are_special_tokens_say_so():
    assert {n for n in ("qwen", "qwen3_coder", "glm45", "deepseekv3", "kimi_k2", "gpt-oss")
            if make_parser(n).special_markers} == {"kimi_k2", "gpt-oss"}
