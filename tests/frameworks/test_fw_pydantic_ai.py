"""pydantic-ai's Agent with a function tool on a Proxy session (chat completions and Responses)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("pydantic_ai", reason="pydantic-ai is not installed (pip install 'dressage[frameworks]')")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import ModelResponse, ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402


def _agent(session, *, responses: bool, calls: list[tuple[int, int]]) -> Agent:
    provider = OpenAIProvider(base_url=session.base_url, api_key="none", http_client=session.log.async_client())
    model = (OpenAIResponsesModel if responses else OpenAIChatModel)("dressage", provider=provider)
    agent = Agent(model, instructions="You are a calculator: use the multiply tool.",
                  model_settings={"max_tokens": 256, "temperature": 0.7}, retries=0)

    @agent.tool_plain
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        calls.append((a, b))
        return a * b

    return agent


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # a plain httpx client (the log's) is still accepted
@pytest.mark.parametrize("streamed, responses", [(False, False), (True, False), (False, True)],
                         ids=["chat", "chat-streamed", "responses"])
def test_agent_runs_a_tool_round_trip_in_one_segment(session, streamed, responses):
    calls: list[tuple[int, int]] = []
    agent = _agent(session, responses=responses, calls=calls)
    seen: list[object] = []

    async def on_events(ctx, events) -> None:  # with a handler the agent streams every model request
        async for event in events:
            seen.append(event)

    async def run():
        return await agent.run("What is 6 times 7?", event_stream_handler=on_events if streamed else None)

    result = asyncio.run(run())
    messages = result.all_messages()
    replies = [m for m in messages if isinstance(m, ModelResponse)]
    assert len(replies) == 2 and len(calls) == 1
    (tool_call,) = [p for p in replies[0].parts if isinstance(p, ToolCallPart)]
    assert tool_call.tool_name == "multiply"
    returned = [p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)]
    assert [r.content for r in returned] == [calls[0][0] * calls[0][1]]
    assert isinstance(result.output, str) and result.output
    assert not streamed or seen
    session.check_run(linear=True)
    # pydantic-ai's own usage count agrees with the Proxy's answers.
    assert result.usage().output_tokens == session.log.completion_tokens
