"""The agents' client side of the Proxy contract, without a server: reply parsing and error labels."""

from __future__ import annotations

import asyncio

import pytest
from openai.types.chat import ChatCompletion

from dressage.errors import ConfigError, ProxyConnectionError, ProxyReplyError, ProxyStatusError, ProxyTimeout
from dressage.harness.agents import AgentConfig, ProxyClient, error_kind, parse_completion, run_rollout


def _completion(message, usage=True, choices=True):
    body = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": message}] if choices else []}
    if usage:
        body["usage"] = {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}
    return ChatCompletion.model_validate(body)


def test_tool_calls_are_kept_as_returned_and_extracted():
    call = {"id": "call_3", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "routing_topk"}'}}
    reply = parse_completion(_completion({"role": "assistant", "content": "Let me check.", "tool_calls": [call]}))
    assert reply.message == {"role": "assistant", "content": "Let me check.", "tool_calls": [call]}
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [("call_3", "lookup", '{"key": "routing_topk"}')]
    assert (reply.prompt_tokens, reply.completion_tokens, reply.finish_reason) == (11, 4, "stop")


def test_a_plain_reply_has_no_tool_calls_key():
    reply = parse_completion(_completion({"role": "assistant", "content": "Done."}))
    assert reply.message == {"role": "assistant", "content": "Done."} and reply.tool_calls == ()


@pytest.mark.parametrize("kwargs, what", [({"usage": False}, "usage"), ({"choices": False}, "choices")])
def test_a_reply_without_usage_or_choices_is_a_typed_error(kwargs, what):
    with pytest.raises(ProxyReplyError, match=what):
        parse_completion(_completion({"role": "assistant", "content": "x"}, **kwargs))


def test_error_kinds_label_status_timeout_connection_and_bad_replies():
    assert error_kind(ProxyStatusError("x", status_code=502)) == "status_502"
    assert error_kind(ProxyTimeout("x")) == "timeout"
    assert error_kind(ProxyConnectionError("x")) == "connection"
    assert error_kind(ProxyReplyError("x")) == "bad_reply"


def test_bad_arguments_are_rejected_before_any_request():
    with pytest.raises(ConfigError, match="proxy_url"):
        ProxyClient("localhost:8000")
    for kwargs in ({"concurrency": 0}, {"concurrency": 2, "n": 0}):
        n = kwargs.pop("n", 2)
        with pytest.raises(ConfigError):
            asyncio.run(run_rollout("http://127.0.0.1:9", ["task"], n, AgentConfig(), **kwargs))
    with pytest.raises(ConfigError, match="AgentConfig"):
        asyncio.run(run_rollout("http://127.0.0.1:9", ["task"], 1, {"max_turns": 2}, concurrency=1))


def test_an_unreachable_proxy_fails_each_session_without_raising():
    report = asyncio.run(run_rollout("http://127.0.0.1:9", ["one task", "another task"], 2,
                                     AgentConfig(request_timeout_s=5), concurrency=2))
    assert report.sessions == 4 and report.finalized == 0
    assert report.errors_by_kind == {"connection": 4}
    assert all(r.status == "failed" and r.error.startswith("create:") for r in report.results)
