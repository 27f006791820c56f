"""Claude Code (``@anthropic-ai/claude-code``) for real, through the Proxy's Anthropic Messages API.

The built-in engine calls a tool on every user turn and answers in prose after tool results
(``tool_call_rate=1``, ``answer_tool_results``): Claude Code streams its first call with its
default tools, gets a ``tool_use`` for one of them with arguments drawn from that tool's schema,
answers it with a ``tool_result`` and ends on the prose reply. On the real Qwen3 template the replies
open with reasoning, which Claude Code sends back as thinking blocks. Every Messages call is watched at
the serving object (request, how it ended, the usage answered), and the recorded trajectory is
checked against what Claude Code reported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from clients.conftest import client_env, run_cli
from dressage.proxy.anthropic.protocol import chat_messages, chat_tools
from dressage.testing.stack import start_engine, start_proxy

pytestmark = [pytest.mark.clients, pytest.mark.timeout(600)]

TASK = "List the files in this directory and say what is in notes.txt."
MODEL = "dressage-test-model"


@dataclass
class Call:
    """One Messages call as the Proxy served it."""

    request: dict[str, Any]
    output_tokens: int = 0
    tool_use_ids: list[str] = field(default_factory=list)
    error: str | None = None


class MessagesWatch:
    """Wraps ``service.messages.open`` to keep each call's request, outcome and answered usage."""

    def __init__(self, service: Any) -> None:
        self.calls: list[Call] = []
        self._open = service.messages.open
        service.messages.open = self.open

    async def open(self, session_id: str, req: Any, **kw: Any) -> Any:
        call = Call(req.model_dump(exclude_none=True))
        self.calls.append(call)
        try:
            out = await self._open(session_id, req, **kw)
        except Exception as exc:
            call.error = repr(exc)
            raise
        if isinstance(out, dict):
            self._note(call, out)
            return out
        return self._frames(call, out)

    @staticmethod
    def _note(call: Call, message: dict[str, Any]) -> None:
        call.output_tokens = message["usage"]["output_tokens"]
        call.tool_use_ids = [b["id"] for b in message["content"] if b["type"] == "tool_use"]

    async def _frames(self, call: Call, frames: Any) -> Any:
        async for frame in frames:
            kind, _, data = frame.decode().partition("\ndata: ")
            body = json.loads(data) if data else {}
            if kind == "event: error":
                call.error = data
            elif kind == "event: message_delta":
                call.output_tokens = body["usage"]["output_tokens"]
            elif kind == "event: content_block_start" and body["content_block"]["type"] == "tool_use":
                call.tool_use_ids.append(body["content_block"]["id"])
            yield frame


def _tito_runs(calls: list[Call]) -> int:
    """How many Segments the calls make while TITO holds: a call continues an earlier call's Segment
    when it sends that call's conversation, then its reply, with the same tools, and no other call
    continued it first.

    Every other call starts a Segment: a conversation Claude Code starts anew (an auxiliary one, a
    sub-agent's); a call whose tools changed (its tool search loaded deferred tools: the rendered
    system turn differs, ``tool_schema_change``); a call that leaves a reply out (Claude Code drops
    an empty one) or goes on from a call already continued (a ``branch`` from the last step both share).
    """
    seen: list[tuple[list[dict[str, Any]], Any]] = []
    continued: set[int] = set()
    runs = 0
    for call in calls:
        msgs = chat_messages(call.request.get("system"), call.request["messages"])
        tools = chat_tools(call.request.get("tools"))
        parents = [j for j, (earlier, same) in enumerate(seen)
                   if j not in continued and tools == same and len(msgs) > len(earlier)
                   and msgs[:len(earlier)] == earlier and msgs[len(earlier)]["role"] == "assistant"]
        if parents:
            continued.add(max(parents, key=lambda j: len(seen[j][0])))
        else:
            runs += 1
        seen.append((msgs, tools))
    return runs


@pytest.fixture(params=["byte", "qwen3"])
def stack(request):
    """Engine + Proxy on the byte tokenizer, or on the real Qwen3 template (replies open with reasoning)."""
    if request.param == "qwen3":
        from dressage.engine.core import Engine

        tok = request.getfixturevalue("qwen3")
        engine = start_engine(seed=5, tokenizer="qwen3", tool_call_rate=1.0, answer_tool_results=True,
                              mean_response_tokens=20, make_engine=lambda config: Engine(config, tok))
        proxy = start_proxy(engine.url, dp_size=1, request_timeout_s=60, served_model_name=MODEL, tokenizer=tok,
                            tokenizer_name="qwen3")
    else:
        engine = start_engine(seed=5, tool_call_rate=1.0, answer_tool_results=True, mean_response_tokens=20)
        proxy = start_proxy(engine.url, dp_size=1, request_timeout_s=60, served_model_name=MODEL)
    try:
        yield proxy
    finally:
        proxy.close()
        engine.stop()


def test_claude_code_runs_its_tool_loop_through_the_proxy(stack, agent_cli, scratch_home, caplog, request):
    claude = agent_cli("claude")
    (scratch_home.work / "notes.txt").write_text("The answer is 42.\n")
    watch = MessagesWatch(stack.service)
    sid = httpx.post(stack.url + "/sessions", json={}, timeout=20).json()["session_id"]
    env = client_env(scratch_home, ANTHROPIC_BASE_URL=f"{stack.url}/sessions/{sid}", ANTHROPIC_API_KEY="dummy",
                     ANTHROPIC_MODEL=MODEL, ANTHROPIC_SMALL_FAST_MODEL=MODEL,
                     CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1",
                     DISABLE_ERROR_REPORTING="1", CLAUDE_CODE_MAX_RETRIES="0")
    run = run_cli([claude, "-p", TASK, "--output-format", "json", "--allowedTools", "Bash,Read,Glob,Grep"],
                  env=env, cwd=scratch_home.work, timeout_s=480)  # the tools it picks may wait
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["type"] == "result" and result["is_error"] is False and result["subtype"] == "success", result
    assert result.get("api_error_status") is None

    # Every call was answered without an error; the agent's own loop streams, with its default tools.
    calls = watch.calls
    assert calls and all(c.error is None for c in calls), [c.error for c in calls]
    assert calls[0].request.get("stream") is True
    assert stack.service.stats()["failed_calls"] == 0
    assert not [r for r in caplog.records if r.name.startswith("dressage") and r.levelname in ("WARNING", "ERROR")]
    offered = {t["name"] for t in calls[0].request["tools"]}
    assert {"Bash", "Read", "Glob", "Grep"} <= offered and len(offered) >= 8

    # The tool loop: the first reply called an offered tool; a later call answered it by its id.
    assert calls[0].tool_use_ids and all(i.startswith("toolu_") for i in calls[0].tool_use_ids)
    answered = {b["tool_use_id"] for c in calls[1:] for m in c.request["messages"] if m["role"] == "user"
                and isinstance(m["content"], list) for b in m["content"] if b.get("type") == "tool_result"}
    assert set(calls[0].tool_use_ids) <= answered
    if request.node.callspec.params["stack"] == "qwen3":  # the model's thinking went back with its tool call
        sent_back = [b["type"] for c in calls[1:] for m in c.request["messages"] if m["role"] == "assistant"
                     for b in m["content"]]
        assert "thinking" in sent_back and "tool_use" in sent_back
    reported = sum(u["outputTokens"] for u in result["modelUsage"].values())
    assert reported == sum(c.output_tokens for c in calls)

    # The trajectory: one Segment per conversation while TITO holds, trained on exactly the reported tokens.
    fin = httpx.post(f"{stack.url}/sessions/{sid}/finalize", json={}, timeout=20).json()
    segs = httpx.get(f"{stack.url}/sessions/{sid}/segments", timeout=20).json()
    assert fin["segments"] == len(segs) == _tito_runs(calls)
    # Segments come in the order their last steps were called: an auxiliary conversation Claude Code ends
    # before its main loop's comes first. The one that trains the session's first step is its new_session.
    reasons = {s["step_ids"][0]: s["boundary_reason"] for s in segs}
    assert reasons[0] == "new_session" and list(reasons.values()).count("new_session") == 1
    assert "tito_mismatch" not in reasons.values()
    assert sum(len(s["step_ids"]) for s in segs) == len(calls)
    assert sum(sum(s["loss_mask"]) for s in segs) == reported
    for seg in segs:
        assert len(seg["tokens"]) == seg["prompt_length"] + seg["response_length"]
        assert seg["large_fields"]["routed_experts"]["rows"] == len(seg["tokens"]) - 1
