"""Qwen Code (``qwen``, chat completions, streamed with usage) against the Proxy and the built-in engine on the
real Qwen3 tokenizer: its ~17K-token prompt and tool loop run to the end, one Segment per conversation."""

from __future__ import annotations

import json

import pytest

from _bins import SERVED_MODEL, check_trajectory, client_bin, only_tools, open_session, qwen3_stack, relay, run_cli, \
    scratch_env

pytestmark = [pytest.mark.clients, pytest.mark.timeout(420)]

SETTINGS = {"general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False},
            "security": {"auth": {"selectedType": "openai"}}}
SAFE_TOOLS = {"list_directory"}
"""The tool the engine calls: listing a (random, so missing) directory only fails."""


def _conversation(request):
    # A conversation is its system prompt and first user turn; every later call of it extends them.
    return request["messages"][:2]


def test_qwen_code_runs_a_task_with_a_tool_round_trip(qwen3, tmp_path, monkeypatch):
    qwen = client_bin("qwen")
    only_tools(monkeypatch, SAFE_TOOLS)
    work = tmp_path / "work"
    work.mkdir()
    with qwen3_stack(qwen3) as proxy, relay(proxy.url) as (url, log):
        sid, path = open_session(proxy)
        env = scratch_env(tmp_path, OPENAI_BASE_URL=url + path, OPENAI_API_KEY="dummy", OPENAI_MODEL=SERVED_MODEL,
                          QWEN_TELEMETRY_ENABLED="false")
        settings = tmp_path / "home" / ".qwen" / "settings.json"
        settings.parent.mkdir(parents=True)
        settings.write_text(json.dumps(SETTINGS))
        done = run_cli([qwen, "--auth-type", "openai", "--approval-mode", "yolo", "--output-format", "json",
                        "List the files in the docs folder, then say done."], env=env, cwd=work, timeout_s=300)
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
        calls = log.model_calls()
        # The agent's loop: a tool call answered, its result sent back as a tool turn, then the final answer.
        loop = [c for c in calls if c.request.get("tools")]
        assert any(m["role"] == "tool" for m in loop[-1].request["messages"])
        assert all(c.request.get("stream") and c.request.get("stream_options", {}).get("include_usage") for c in loop)
        # It exits 0 even when a stream carried an error: its own report must say there was none.
        result = json.loads(done.stdout)[-1]
        assert result["type"] == "result" and result["is_error"] is False
        api = result["stats"]["models"][SERVED_MODEL]["api"]
        assert api["totalErrors"] == 0 and api["totalRequests"] == len(calls)
        assert result["usage"]["output_tokens"] == log.completion_tokens
        check_trajectory(proxy, sid, log, _conversation)
