"""Each tool-call / reasoning parser family reads back what its model's template writes, whole
and streamed in any chunking, and never streams text that turns out to be part of a call."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.errors import ConfigError
from dressage.proxy.openai.streaming import ContentStream
from dressage.proxy.parsers import assistant_message, default_parsers, make_parser
from dressage.proxy.parsers.glm import render_glm_call
from dressage.proxy.parsers.qwen_xml import render_xml_call

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "ratio": {"type": "number"}, "opts": {"type": "object"}, "tags": {"type": "array", "items": {"type": "string"}}}}}},
         {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
             "q": {"type": "string"}}}}}]

CALLS = [("get_weather", {"city": "Paris 75", "days": 3, "metric": True, "ratio": 0.5, "opts": {"a": [1, 2]},
                          "tags": ["x", "y"]}),
         ("search", {"q": "line one\nline two <b>"})]


def _json(name, args):
    return json.dumps({"name": name, "arguments": args})


def _render(family, calls, content="Let me check.", reasoning="I think so."):
    """A reply as the family's chat template writes an assistant turn with these calls."""
    think = f"<think>\n{reasoning}\n</think>\n\n"
    if family == "qwen":
        return think + content + "\n" + "\n".join(f"<tool_call>\n{_json(n, a)}\n</tool_call>" for n, a in calls)
    if family == "qwen3_coder":
        return think + content + "\n" + "\n".join(render_xml_call(n, a) for n, a in calls)
    if family == "glm45":
        return think + content + "".join(render_glm_call(n, a) for n, a in calls)
    if family == "glm47":
        return think + content + "".join(render_glm_call(n, a, newlines=False) for n, a in calls)
    if family == "deepseekv3":
        body = "".join(f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{json.dumps(a)}\n```<｜tool▁call▁end｜>"
                       for n, a in calls)
        return f"{reasoning}</think>{content}" + (f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>" if calls else "")
    if family == "deepseekv31":
        body = "".join(f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{json.dumps(a)}<｜tool▁call▁end｜>" for n, a in calls)
        return f"{reasoning}</think>{content}" + (f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>" if calls else "")
    if family == "kimi_k2":
        body = "".join(f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{json.dumps(a)}<|tool_call_end|>"
                       for i, (n, a) in enumerate(calls))
        return think + content + (f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>" if calls else "")
    if family == "gpt-oss":
        out = f"<|channel|>analysis<|message|>{reasoning}<|end|>"
        out += "".join(f"<|start|>assistant<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>"
                       f"{json.dumps(a)}<|call|>" for n, a in calls)
        return out
    raise AssertionError(family)


FAMILIES = ["qwen", "qwen3_coder", "glm45", "glm47", "deepseekv3", "deepseekv31", "kimi_k2", "gpt-oss"]


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
    (("zai-org/GLM-4.6",), ("glm45", "glm45")), (("glm-5.2-744b-a40b",), ("glm45", "glm45")),
    (("deepseek-ai/DeepSeek-V3.1",), ("deepseekv31", "deepseek-v3")),
    (("deepseek-ai/DeepSeek-V3-0324",), ("deepseekv3", "deepseek-r1")),
    (("moonshotai/Kimi-K2-Instruct",), ("kimi_k2", "kimi_k2")), (("openai/gpt-oss-20b",), ("gpt-oss", "gpt-oss")),
    (("tiny-moe",), ("qwen", "qwen3")), ((None, "GLM-4.7"), ("glm45", "glm45")),
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
    cs = ContentStream(parser)
    shown = []
    for prefix in prefixes:
        for delta in cs.feed(prefix):
            shown.append(delta)
    message = assistant_message(parser, final_text, call_id_prefix="c", tools=TOOLS)
    streamed_before_end = "".join(d.get("content", "") for d in shown)
    shown.extend(cs.finish(message))
    return message, shown, streamed_before_end


@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from(FAMILIES), n_calls=st.integers(0, 2), cuts=st.lists(st.integers(0, 600), max_size=25))
def test_streamed_in_any_chunking_the_deltas_add_up_to_the_message_and_never_show_call_text(family, n_calls, cuts):
    parser = _parser(family)
    text = _render(family, CALLS[:n_calls], content="Here it is: a < b and c.")
    if family == "gpt-oss" and not n_calls:
        text += "<|start|>assistant<|channel|>final<|message|>Here it is: a < b and c.<|return|>"
    message, shown, early = _stream(parser, _chunks(text, cuts), text)
    content = "".join(d.get("content", "") for d in shown)
    assert content.strip() == (message["content"] or "").strip()
    assert [d["reasoning_content"] for d in shown if "reasoning_content" in d] == [message["reasoning_content"]]
    calls = [c for d in shown for c in d.get("tool_calls", ())]
    assert [c["function"] for c in calls] == [c["function"] for c in message.get("tool_calls", [])]
    for marker in ("<tool_call", "<｜tool", "<|tool", "<|channel", "<|start", "functions.", "<think", "</think"):
        assert marker not in early
