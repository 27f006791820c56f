"""Streamed chat replies: content deltas never retract and add up to the parsed (recorded) message."""

import json

import pytest

from dressage.proxy.openai.chat.prompt import QwenToolCallParser, ToolCallParser, effective_tools, same_message
from dressage.errors import ChatTemplateError
from dressage.proxy.openai.streaming import ContentStream, replay_chunks

CALL = '<tool_call>\n{"name": "calc", "arguments": {"a": 1}}\n</tool_call>'
REPLIES = [
    "Plain words, nothing else.",
    "  leading blanks and trailing  \n",
    "Let me compute.\n" + CALL,
    CALL,
    CALL + "\n" + CALL.replace('"a": 1', '"a": 2') + " after",
    "<think>\nfirst I reason\n</think>\n\nThe answer is 42.",
    "<think>why</think>" + CALL,
    "<think>never closed, so all of it is content",
    "broken <tool_call>{not json}</tool_call> stays content",
    "cut off <tool_call>\n{\"name\": \"calc\", \"argu",
    "a < b and <tool_ but not a tag",
    "ünïcödé text \N{GRINNING FACE} fine",
]


def _stream(parser, text, step=1):
    cs = ContentStream(parser)
    deltas = []
    for end in range(step, len(text) + step, step):
        deltas += cs.feed(text[:end])
    content, reasoning, calls = parser.parse(text, call_id_prefix="c")
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    deltas += cs.finish(message)
    return message, deltas


@pytest.mark.parametrize("text", REPLIES)
@pytest.mark.parametrize("step", [1, 7])
def test_streamed_deltas_add_up_to_the_recorded_message(text, step):
    message, deltas = _stream(QwenToolCallParser(), text, step)
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = [d["reasoning_content"] for d in deltas if "reasoning_content" in d]
    calls = [c for d in deltas for c in d.get("tool_calls", ())]
    assert content.strip() == (message["content"] or "").strip()
    assert reasoning == ([message["reasoning_content"]] if "reasoning_content" in message else [])
    assert [c["function"] for c in calls] == [c["function"] for c in message.get("tool_calls", [])]
    assert [c["id"] for c in calls] == [c["id"] for c in message.get("tool_calls", [])]
    # What an agent rebuilds from the stream continues the recorded step (TITO).
    rebuilt = {"role": "assistant", "content": content or None, "tool_calls": calls or None}
    assert same_message(rebuilt, message)


def test_content_is_streamed_before_the_reply_ends_but_no_tag_leaks():
    parser = QwenToolCallParser()
    cs = ContentStream(parser)
    text = "Let me compute this for you.\n" + CALL
    early = []
    for end in range(1, len(text) + 1):
        early += [d["content"] for d in cs.feed(text[:end]) if "content" in d]
    assert "".join(early) == "Let me compute this for you."
    assert not any("<" in piece for piece in early)


def test_a_parser_without_stream_support_sends_everything_at_the_end():
    class Plain(ToolCallParser):
        def parse(self, text, *, call_id_prefix):
            return text, None, []

    cs = ContentStream(Plain())
    assert cs.feed("partial") == []
    assert cs.finish({"role": "assistant", "content": "partial reply"}) == [{"content": "partial reply"}]


def test_replayed_reply_is_a_complete_stream():
    response = {"id": "chatcmpl-x", "created": 1, "model": "m", "usage": {"prompt_tokens": 1},
                "choices": [{"message": {"role": "assistant", "content": "hi", "tool_calls": [
                    {"id": "c_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                    "finish_reason": "tool_calls"}]}
    frames = list(replay_chunks(response, include_usage=True))
    assert frames[-1] == b"data: [DONE]\n\n"
    bodies = [json.loads(f[6:]) for f in frames[:-1]]
    assert bodies[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert bodies[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert bodies[-1]["choices"] == [] and bodies[-1]["usage"] == {"prompt_tokens": 1}


def test_tool_choice_selects_the_rendered_tools():
    tools = [{"type": "function", "function": {"name": n}} for n in ("a", "b")]
    assert effective_tools(tools, "none") is None
    assert effective_tools(tools, None) == tools == effective_tools(tools, "required")
    assert effective_tools(tools, {"type": "function", "function": {"name": "b"}}) == [tools[1]]
    with pytest.raises(ChatTemplateError, match="'c'"):
        effective_tools(tools, {"type": "function", "function": {"name": "c"}})
