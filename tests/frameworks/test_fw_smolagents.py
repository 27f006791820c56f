"""smolagents' ToolCallingAgent with OpenAIServerModel on Proxy sessions.

smolagents sends earlier tool calls back as text ("Calling tools: ...") and tool results as user
turns, so each request rewrites the tokens of the replies before it: a session of several calls
is several Segments, and each generated token is still trained in exactly one of them.
"""

from __future__ import annotations

import pytest

pytest.importorskip("smolagents", reason="smolagents is not installed (pip install 'dressage[frameworks]')")

from smolagents import OpenAIServerModel, ToolCallingAgent, tool  # noqa: E402

TASKS = ("What is 2 + 3?", "What is 4 + 5?", "What is 6 + 7?", "What is 8 + 9?", "What is 10 + 11?")


def _run(session, task: str, calls: list[tuple[int, int]], seed: int):
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        calls.append((a, b))
        return a + b

    # smolagents sends tool_choice "required" (the engine's grammar makes every reply a call) and
    # refuses a reply that calls final_answer beside another tool: one call per reply, as its prompt asks.
    model = OpenAIServerModel(model_id="dressage", api_base=session.base_url, api_key="none",
                              client_kwargs={"http_client": session.log.client(), "max_retries": 0},
                              max_tokens=256, temperature=0.7, seed=seed,  # seeded: the same draws every run
                              parallel_tool_calls=False)
    agent = ToolCallingAgent(tools=[add], model=model, max_steps=10, verbosity_level=0)
    return agent, agent.run(task, return_full_result=True)


def test_tool_calling_agent_reaches_a_final_answer_and_trains_each_token_once(new_session):
    # The engine picks among the offered tools (add and smolagents' final_answer), and the tool call
    # ids the Proxy draws come back in smolagents' prompts, so a run may also call add until
    # max_steps. Tasks run until one calls add and then answers; every run is checked.
    round_trips = 0
    for i, task in enumerate(TASKS):
        session, calls = new_session(i), []
        agent, result = _run(session, task, calls, seed=100 + i)
        assert result.state in ("success", "max_steps_error"), result.state
        called = [c.name for step in agent.memory.steps for c in (getattr(step, "tool_calls", None) or ())]
        assert called.count("add") == len(calls) and all(isinstance(v, int) for c in calls for v in c)
        n = len(session.log.usages)
        segments = session.check_run(linear=True if n == 1 else None, min_calls=1)
        assert all(s["boundary_reason"] == "tito_mismatch" for s in segments[1:])
        if calls:
            assert len(segments) > 1  # the tool call came back as text
        if result.state == "success":
            assert result.output is not None
            # smolagents' own token count agrees with the Proxy's answers.
            assert result.token_usage.output_tokens == session.log.completion_tokens
            if calls:
                round_trips += 1
                break
    assert round_trips == 1
