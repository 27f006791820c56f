"""litellm's completion API (the OpenAI-compatible route other frameworks build on) on a Proxy session.

A hand-written tool loop: the model calls the tool, the result goes back, the model answers;
plain and streamed (chunks rebuilt with ``litellm.stream_chunk_builder``).
"""

from __future__ import annotations

import json

import pytest

litellm = pytest.importorskip("litellm", reason="litellm is not installed (pip install 'dressage[frameworks]')")

TOOLS = [{"type": "function", "function": {"name": "multiply", "description": "Multiply two integers.",
                                            "parameters": {"type": "object",
                                                           "properties": {"a": {"type": "integer"},
                                                                          "b": {"type": "integer"}}}}}]


def _complete(session, messages, *, stream: bool):
    kw = {"model": "openai/dressage", "api_base": session.base_url, "api_key": "none", "messages": messages,
          "tools": TOOLS, "max_tokens": 256, "temperature": 0.7, "num_retries": 0}
    if not stream:
        return litellm.completion(**kw)
    chunks = list(litellm.completion(**kw, stream=True, stream_options={"include_usage": True}))
    return litellm.stream_chunk_builder(chunks, messages=messages)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_completion_tool_loop_is_one_segment(session, monkeypatch, stream):
    monkeypatch.setattr(litellm, "client_session", session.log.client())  # litellm's OpenAI calls go through it
    monkeypatch.setattr(litellm, "suppress_debug_info", True)
    messages = [{"role": "system", "content": "You are a calculator."},
                {"role": "user", "content": "What is 6 times 7?"}]
    first = _complete(session, messages, stream=stream)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.tool_calls
    call = message.tool_calls[0]
    assert call.function.name == "multiply"
    args = json.loads(call.function.arguments)
    messages.append(message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id,
                     "content": str(int(args.get("a", 0)) * int(args.get("b", 0)))})
    final = _complete(session, messages, stream=stream)
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.content
    assert not final.choices[0].message.tool_calls
    session.check_run(linear=True)
    # litellm's usage agrees with the Proxy's answers.
    assert first.usage.completion_tokens + final.usage.completion_tokens == session.log.completion_tokens
