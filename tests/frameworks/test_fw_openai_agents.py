"""openai-agents (the OpenAI Agents SDK) runs its agent loop against a Proxy session, with its chat
completions model and with its Responses model (the SDK's default)."""

from __future__ import annotations

import asyncio
import json

import pytest

agents = pytest.importorskip("agents", reason="openai-agents is not installed (pip install 'dressage[frameworks]')")
openai = pytest.importorskip("openai")

from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner,  # noqa: E402
                    function_tool)

agents.set_tracing_disabled(True)  # no export to OpenAI's trace endpoint


def _keep_body(sent: list[dict]):
    async def hook(request):
        sent.append(json.loads(request.content))
    return hook


def _agent(model, calls: list[tuple[int, int]]) -> Agent:
    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    return Agent(name="calculator", instructions="Use the add tool, then answer.", tools=[add], model=model,
                 # include_usage: the SDK asks for streamed usage by itself only from api.openai.com.
                 model_settings=ModelSettings(max_tokens=256, temperature=0.7, include_usage=True))


async def _run(agent: Agent, stream: bool, **kw):
    if not stream:
        return await Runner.run(agent, "What is 2 + 3?", max_turns=4, **kw)
    result = Runner.run_streamed(agent, "What is 2 + 3?", max_turns=4, **kw)
    async for _ in result.stream_events():
        pass
    return result


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_chat_completions_model_runs_a_tool_round_trip_in_one_segment(session, stream):
    calls: list[tuple[int, int]] = []

    async def main():
        client = openai.AsyncOpenAI(base_url=session.base_url, api_key="none", http_client=session.log.async_client())
        try:
            result = await _run(_agent(OpenAIChatCompletionsModel(model="dressage", openai_client=client), calls),
                                stream)
        finally:
            await client.close()
        return result

    result = asyncio.run(main())
    assert isinstance(result.final_output, str) and result.final_output
    kinds = [item.type for item in result.new_items if item.type != "reasoning_item"]  # thinking templates
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"] or \
        kinds == ["message_output_item", "tool_call_item", "tool_call_output_item", "message_output_item"]
    assert len(calls) == 1 and all(isinstance(v, int) for v in calls[0])
    (seg,) = session.check_run(linear=True)
    # The SDK's own usage accounting agrees with the Proxy's answers.
    assert result.context_wrapper.usage.output_tokens == session.log.completion_tokens
    assert len(seg["step_ids"]) == result.context_wrapper.usage.requests == 2


@pytest.mark.parametrize("stream, chained", [(False, False), (True, False), (False, True)],
                         ids=["plain", "streamed", "chained"])
def test_responses_model_runs_a_tool_round_trip_in_one_segment(session, stream, chained):
    calls: list[tuple[int, int]] = []
    sent: list[dict] = []

    async def main():
        log = session.log
        http = log.async_client(event_hooks={"request": [_keep_body(sent)], "response": [log.ahook]})
        client = openai.AsyncOpenAI(base_url=session.base_url, api_key="none", http_client=http)
        try:
            # chained: the SDK sends previous_response_id and only the new items after the first call.
            result = await _run(_agent(OpenAIResponsesModel(model="dressage", openai_client=client), calls), stream,
                                auto_previous_response_id=chained)
        finally:
            await client.close()
        return result

    result = asyncio.run(main())
    assert isinstance(result.final_output, str) and result.final_output
    kinds = [item.type for item in result.new_items if item.type != "reasoning_item"]  # thinking templates
    assert kinds[-3:] == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert len(calls) == 1 and all(isinstance(v, int) for v in calls[0])
    (seg,) = session.check_run(linear=True)
    assert result.context_wrapper.usage.output_tokens == session.log.completion_tokens
    assert len(seg["step_ids"]) == result.context_wrapper.usage.requests == 2
    assert [("previous_response_id" in body) for body in sent] == [False, chained]
