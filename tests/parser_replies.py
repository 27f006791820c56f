"""Replies as each family's chat template writes them, shared by the parser tests."""

import json

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


def json_call_text(name, args):
    return json.dumps({"name": name, "arguments": args})


def render(family, calls, content="Let me check.", reasoning="I think so."):
    """A reply as the family's chat template writes an assistant turn with these calls."""
    think = f"<think>\n{reasoning}\n</think>\n\n"
    if family == "qwen":
        return think + content + "\n" + "\n".join(f"<tool_call>\n{json_call_text(n, a)}\n</tool_call>" for n, a in calls)
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
