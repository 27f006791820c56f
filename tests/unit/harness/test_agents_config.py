"""AgentConfig validation, the built-in tools, prompts and the reward."""

from __future__ import annotations

import json

import pytest

from dressage.errors import ConfigError
from dressage.harness.agents import AgentConfig, TaskPrompt, as_task_prompt, execute_tool, make_prompts, score_transcript
from dressage.harness.agents.tools import LOOKUP_TABLE, TOOL_SPECS


def test_defaults_are_valid_and_compress_at_is_the_share_of_the_limit():
    cfg = AgentConfig(context_length=1000, compression_threshold=0.75, max_tokens=100)
    assert cfg.compress_at == 750


@pytest.mark.parametrize("kwargs, key", [
    ({"max_turns": 0}, "agents.max_turns"),
    ({"max_turns": True}, "agents.max_turns"),
    ({"retry_rate": 1.5}, "agents.retry_rate"),
    ({"retry_rate": -0.1}, "agents.retry_rate"),
    ({"retry_rate": "0.1"}, "agents.retry_rate"),
    ({"compression_threshold": 0.0}, "agents.compression_threshold"),
    ({"temperature": 3.0}, "agents.temperature"),
    ({"max_tokens": 0}, "agents.max_tokens"),
    ({"seed": -1}, "agents.seed"),
    ({"tools": 1}, "agents.tools"),
    ({"compression": "yes"}, "agents.compression"),
    ({"request_timeout_s": 0}, "agents.request_timeout_s"),
    ({"model": ""}, "agents.model"),
    ({"context_length": 1000, "max_tokens": 900}, "agents.max_tokens"),
])
def test_bad_values_are_rejected_with_the_dotted_key(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        AgentConfig(**kwargs)


def test_config_is_keyword_only_and_slotted():
    with pytest.raises(TypeError):
        AgentConfig(8)  # type: ignore[misc]
    with pytest.raises((AttributeError, TypeError)):
        AgentConfig().unknown = 1  # type: ignore[attr-defined]


def test_calculator_and_lookup_are_pure_and_report_errors_as_tool_text():
    assert execute_tool("calculator", json.dumps({"op": "mul", "a": 6, "b": 7})).content == "42"
    assert execute_tool("calculator", {"op": "div", "a": 1, "b": 4}).content == "0.25"
    bad = execute_tool("calculator", {"op": "div", "a": 1, "b": 0})
    assert not bad.ok and bad.content.startswith("error:") and "zero" in bad.content
    assert execute_tool("lookup", '{"key": "bits_per_byte"}').content == "bits_per_byte = 8"
    assert not execute_tool("lookup", '{"key": "nope"}').ok
    assert not execute_tool("search", "{}").ok
    assert not execute_tool("calculator", "{not json").ok
    assert not execute_tool("calculator", '{"op": "add", "a": true, "b": 1}').ok
    assert not execute_tool("calculator", {"op": "pow", "a": -2, "b": 0.5}).ok


def test_tool_specs_are_openai_function_tools_covering_the_lookup_table():
    names = [t["function"]["name"] for t in TOOL_SPECS]
    assert names == ["calculator", "lookup"]
    assert all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object" for t in TOOL_SPECS)
    assert TOOL_SPECS[1]["function"]["parameters"]["properties"]["key"]["enum"] == sorted(LOOKUP_TABLE)


def test_make_prompts_is_reproducible_varied_and_prefix_stable():
    a, b = make_prompts(40, seed=3), make_prompts(40, seed=3)
    assert a == b
    assert make_prompts(10, seed=3) == a[:10]
    assert make_prompts(40, seed=4) != a
    assert len({p.kind for p in a}) >= 4
    assert len({len(p.user) for p in a}) > 20
    assert [p.index for p in a] == list(range(40))
    assert all(p.keywords and p.system for p in a)
    with pytest.raises(ConfigError):
        make_prompts(-1)


def test_plain_string_prompts_become_tasks():
    p = as_task_prompt("Explain the routing replay buffer", 5)
    assert p.index == 5 and p.kind == "custom" and p.keywords == ("explain", "routing", "replay")
    with pytest.raises(ConfigError, match=r"prompts\[2\]"):
        as_task_prompt("  ", 2)


def test_reward_counts_keywords_said_and_tool_calls_that_worked():
    prompt = TaskPrompt(index=0, kind="custom", system="s", user="u", keywords=("cache", "expert"))
    said_one = [{"role": "assistant", "content": "The Cache is full."}]
    assert score_transcript(prompt, said_one) == 0.5
    tools = said_one + [{"role": "tool", "tool_call_id": "a", "content": "8"},
                        {"role": "tool", "tool_call_id": "b", "content": "error: division by zero"}]
    assert score_transcript(prompt, tools) == 0.5 * 0.5 + 0.5 * 0.5
    # Keywords in user or tool text do not count: only what the assistant said.
    assert score_transcript(prompt, [{"role": "user", "content": "cache expert"}]) == 0.0
