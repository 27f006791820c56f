"""mini-swe-agent (DefaultAgent, LitellmModel, LocalEnvironment) on a Proxy session.

Its bash tool runs the engine's commands in an empty folder that is also the only PATH entry: the
built-in engine's commands are single words, so only shell built-ins can run. A reply without a tool call is a
format error, which mini-swe-agent drops from its history: the next request branches from the
reply before it, and each generated token is still trained in exactly one Segment.
"""

from __future__ import annotations

import pytest

pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed (pip install 'dressage[frameworks]')")
litellm = pytest.importorskip("litellm")

from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402


@pytest.mark.parametrize("step_limit, linear", [(2, True), (4, False)], ids=["linear", "dropped-reply"])
def test_default_agent_runs_bash_tool_calls_and_trains_each_token_once(session, monkeypatch, tmp_path,
                                                                       step_limit, linear):
    monkeypatch.setattr(litellm, "client_session", session.log.client())  # litellm's OpenAI calls go through it
    monkeypatch.setattr(litellm, "suppress_debug_info", True)
    # cost_tracking: litellm has no price for a local model.
    model = LitellmModel(model_name="openai/dressage", cost_tracking="ignore_errors",
                         model_kwargs={"api_base": session.base_url, "api_key": "none", "max_tokens": 256,
                                       "temperature": 0.7})
    env = LocalEnvironment(cwd=str(tmp_path), env={"PATH": str(tmp_path)}, timeout=10)
    agent = DefaultAgent(model, env, system_template="You run one bash command per reply.",
                         instance_template="Task: {{task}}", step_limit=step_limit)
    out = agent.run("print the working directory")
    assert out["exit_status"] == "LimitsExceeded"  # the engine never submits; the step limit ends the run
    roles = [m["role"] for m in agent.messages]
    assert roles[:4] == ["system", "user", "assistant", "tool"] and roles[-1] == "exit"
    assert agent.n_calls == step_limit
    segments = session.check_run(linear=linear, min_calls=step_limit)
    assert all(s["boundary_reason"] == "branch" for s in segments[1:])
