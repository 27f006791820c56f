"""OpenAI's Codex CLI (``codex exec``, Responses API) against the Proxy and the built-in engine on the real
Qwen3 tokenizer: its default request (client_metadata, reasoning, include, the ``multi_agent_v1`` namespace
tool group) is served, a call of a namespaced tool comes back to it as such, and the task is one Segment."""

from __future__ import annotations

import json

import pytest

from _bins import SERVED_MODEL, check_trajectory, client_bin, only_tools, open_session, qwen3_stack, relay, run_cli, \
    scratch_env

pytestmark = [pytest.mark.clients, pytest.mark.timeout(420)]

NAMESPACED = "multi_agent_v1.close_agent"
"""The tool the engine calls: one of the namespace group's (closing an agent that does not exist only fails)."""


def _config(base_url: str) -> str:
    return f"""
model = "{SERVED_MODEL}"
model_provider = "local"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
web_search = "disabled"

[model_providers.local]
name = "local"
base_url = "{base_url}"
env_key = "DRESSAGE_TEST_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[features]
# On by default; named so that the namespace group is sent whatever a later version defaults to.
multi_agent = true

[analytics]
enabled = false

[feedback]
enabled = false
"""


def _conversation(request):
    # A conversation is its instructions and first input items; every later call of it extends them.
    items = [i for i in request["input"] if i.get("type", "message") == "message"][:3]
    return [request.get("instructions"), items]


def test_codex_exec_runs_a_task_through_a_namespaced_tool_call(qwen3, tmp_path, monkeypatch):
    codex = client_bin("codex")
    only_tools(monkeypatch, {NAMESPACED})
    work = tmp_path / "work"
    work.mkdir()
    with qwen3_stack(qwen3) as proxy, relay(proxy.url) as (url, log):
        sid, path = open_session(proxy)
        env = scratch_env(tmp_path, CODEX_HOME=str(tmp_path / "codex"), DRESSAGE_TEST_KEY="dummy")
        (tmp_path / "codex").mkdir()
        (tmp_path / "codex" / "config.toml").write_text(_config(url + path))
        done = run_cli([codex, "exec", "--skip-git-repo-check", "--ephemeral", "--color", "never", "--json",
                        "Close the helper agent you no longer need, then say done."],
                       env=env, cwd=work, timeout_s=300)
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert not [e for e in events if e.get("type") in ("error", "turn.failed")], events
        assert events[-1]["type"] == "turn.completed"
        calls = log.model_calls()
        first = calls[0].request
        # What Codex sends by default reached the model: the namespace group among the tools.
        assert any(t.get("type") == "namespace" for t in first["tools"]) and "client_metadata" in first
        # The namespaced call went back to Codex with its namespace, and came back from it as such.
        sent_back = [i for c in calls[1:] for i in c.request["input"] if i.get("type") == "function_call"]
        assert sent_back and {(i.get("namespace"), i["name"]) for i in sent_back} == {("multi_agent_v1", "close_agent")}
        outputs = [i for i in calls[-1].request["input"] if i.get("type") == "function_call_output"]
        assert [o["call_id"] for o in outputs] == [i["call_id"] for i in sent_back]
        segments = check_trajectory(proxy, sid, log, _conversation)
        assert len(segments) == 1 and len(calls) >= 2
