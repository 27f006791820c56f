"""OpenCode (``opencode run``, chat completions through ``@ai-sdk/openai-compatible``) against the Proxy and the
built-in engine on the real Qwen3 tokenizer: its title call and its agent loop are two conversations of one
session, each one Segment."""

from __future__ import annotations

import json

import pytest

from _bins import ROOT, SERVED_MODEL, check_trajectory, client_bin, only_tools, open_session, qwen3_stack, relay, \
    run_cli, scratch_env

pytestmark = [pytest.mark.clients, pytest.mark.timeout(600)]

CACHE = ROOT / ".deps" / "opencode-cache"
"""OpenCode fetches its provider and plugin packages from the npm registry on its first start; kept here so a
later run (and CI) reuses them."""
SAFE_TOOLS = {"read"}
"""The tool the engine calls: reading a random (so missing) file in a scratch folder only fails."""


def _config(base_url: str) -> dict:
    return {"$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled",
            "permission": {"*": "allow"}, "model": f"local/{SERVED_MODEL}",
            "provider": {"local": {"npm": "@ai-sdk/openai-compatible", "name": "local",
                                   "options": {"baseURL": base_url, "apiKey": "dummy"},
                                   "models": {SERVED_MODEL: {"tool_call": True,
                                                             "limit": {"context": 65536, "output": 4096}}}}}}


def _conversation(request):
    # A conversation is its system prompt and first user turn; every later call of it extends them.
    return request["messages"][:2]


def test_opencode_title_call_and_agent_loop_are_two_conversations_of_one_session(qwen3, tmp_path, monkeypatch):
    opencode = client_bin("opencode")
    only_tools(monkeypatch, SAFE_TOOLS)
    work = tmp_path / "work"
    work.mkdir()
    CACHE.mkdir(parents=True, exist_ok=True)
    with qwen3_stack(qwen3) as proxy, relay(proxy.url) as (url, log):
        sid, path = open_session(proxy)
        config = tmp_path / "opencode.json"
        config.write_text(json.dumps(_config(url + path)))
        env = scratch_env(tmp_path, OPENCODE_CONFIG=str(config), XDG_CACHE_HOME=str(CACHE),
                          npm_config_cache=str(CACHE / "npm"),
                          OPENCODE_DISABLE_MODELS_FETCH="1", OPENCODE_DISABLE_AUTOUPDATE="1",
                          OPENCODE_DISABLE_LSP_DOWNLOAD="1", OPENCODE_DISABLE_SHARE="1",
                          OPENCODE_DISABLE_DEFAULT_PLUGINS="1", OPENCODE_DISABLE_CLAUDE_CODE="1")
        done = run_cli([opencode, "run", "Find the markdown files here, then say done."], env=env, cwd=work,
                       timeout_s=480)
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
        calls = log.model_calls()
        titled = [c for c in calls if not c.request.get("tools")]
        loop = [c for c in calls if c.request.get("tools")]
        assert titled and len(loop) >= 2 and any(m["role"] == "tool" for m in loop[-1].request["messages"])
        segments = check_trajectory(proxy, sid, log, _conversation)
        assert len(segments) == 2
