"""CommandAgent: a command per session, its environment, its reward file, its time-out."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from dressage.agents import CommandAgent, CommandResult, SessionContext, reward_number
from dressage.errors import AgentCommandError, ConfigError


def ctx(**over):
    base = dict(session_id="sess-1", base_url="http://h:1/sessions/sess-1/v1",
                anthropic_base_url="http://h:1/sessions/sess-1",
                api_key="k", headers={"X-Session-Id": "sess-1", "X-Instance-Id": "3"}, model="m", prompt="Fix the bug",
                label="L", metadata={"repo": "x"}, group_index=3, index=7)
    base.update(over)
    return SessionContext(**base)


def test_context_env_points_clients_at_the_session():
    env = ctx().env()
    assert env["OPENAI_BASE_URL"] == "http://h:1/sessions/sess-1/v1"
    assert env["ANTHROPIC_BASE_URL"] == "http://h:1/sessions/sess-1"
    assert env["OPENAI_API_KEY"] == env["ANTHROPIC_AUTH_TOKEN"] == env["ANTHROPIC_API_KEY"] == "k"
    assert env["OPENAI_MODEL"] == env["ANTHROPIC_MODEL"] == "m"
    assert env["DRESSAGE_SESSION_ID"] == "sess-1" and env["DRESSAGE_INSTANCE_ID"] == "3"


SCRIPT = r"""
import json, os, sys
p = json.load(open(os.environ["DRESSAGE_PROMPT_FILE"]))
open(os.environ["DRESSAGE_REWARD_FILE"], "w").write(json.dumps({"score": len(sys.argv[1]), "label": p["label"],
    "cwd_ok": os.getcwd() == os.environ["DRESSAGE_WORKDIR"], "sid": os.environ["DRESSAGE_SESSION_ID"],
    "extra": os.environ["EXTRA"], "meta": p["metadata"]["repo"]}))
"""


def test_the_command_gets_its_placeholders_environment_and_writes_the_reward(tmp_path):
    agent = CommandAgent([sys.executable, "-c", SCRIPT, "{prompt}", "{session_id}"], env={"EXTRA": "e"}, cwd=tmp_path)
    reward = asyncio.run(agent(ctx()))
    assert reward == {"score": len("Fix the bug"), "label": "L", "cwd_ok": True, "sid": "sess-1", "extra": "e",
                      "meta": "x"}
    assert os.listdir(tmp_path) == []   # the working directory is removed


def test_a_reward_callable_gets_the_command_result(tmp_path):
    seen = {}

    async def score(c, result: CommandResult):
        seen["result"] = result
        return 0.5 if "ok" in result.stdout else 0.0

    agent = CommandAgent([sys.executable, "-c", "print('ok')"], reward=score, cwd=tmp_path, keep_workdir=True)
    assert asyncio.run(agent(ctx())) == 0.5
    r = seen["result"]
    assert r.returncode == 0 and r.stdout.strip() == "ok" and os.path.isdir(r.workdir)


def test_no_reward_file_fails_naming_the_file_exit_code_and_stderr():
    agent = CommandAgent([sys.executable, "-c", "import sys; sys.stderr.write('boom here'); sys.exit(3)"])
    with pytest.raises(AgentCommandError, match=r"wrote no reward to .*dressage_reward.json \(exit code 3; "
                                                r"stderr: boom here\)"):
        asyncio.run(agent(ctx()))


def test_an_unreadable_reward_file_fails():
    agent = CommandAgent([sys.executable, "-c",
                          "import os; open(os.environ['DRESSAGE_REWARD_FILE'], 'w').write('not json')"])
    with pytest.raises(AgentCommandError, match="unreadable reward"):
        asyncio.run(agent(ctx()))


def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
              f" open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    agent = CommandAgent([sys.executable, "-c", script], timeout_s=1.5)
    with pytest.raises(AgentCommandError, match="killed after 1.5 s"):
        asyncio.run(agent(ctx()))
    child = int(pidfile.read_text())
    for _ in range(100):   # the kill is delivered; reaping by init may take a moment
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:
            if f.read().split()[2] == "Z":
                break
        asyncio.run(asyncio.sleep(0.05))
    else:
        pytest.fail(f"child {child} outlived the agent's time-out")


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="argv"):
        CommandAgent("echo hi")
    with pytest.raises(ConfigError, match="timeout_s"):
        CommandAgent(["echo"], timeout_s=0)


def test_reward_number():
    assert reward_number(2, None) == 2.0
    assert reward_number({"acc": 1}, "acc") == 1.0
    with pytest.raises(ConfigError, match="--reward-key"):
        reward_number({"acc": 1}, None)
    with pytest.raises(ValueError, match="finite"):
        reward_number(float("nan"), None)
    with pytest.raises(ValueError, match="number"):
        reward_number("1", None)
