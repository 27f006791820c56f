"""Two conversations in one Proxy session, as OpenCode runs them: its agent loop (system prompt and
tools) and a title-generation call (another system prompt, no tools), interleaved in either order."""

import httpx
import openai
import pytest

from dressage.testing.stack import start_engine, start_proxy

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]
AGENT = [{"role": "system", "content": "You are opencode, an interactive CLI agent."},
         {"role": "user", "content": "list the files"}]
TITLE = [{"role": "system", "content": "You write a five-word title for the conversation."},
         {"role": "user", "content": "list the files"}]


@pytest.fixture(scope="module")
def stack():
    eng = start_engine(tool_call_rate=1.0, answer_tool_results=True, mean_response_tokens=20)
    p = start_proxy(eng.url)
    yield p
    p.close()
    eng.stop()


@pytest.mark.parametrize("title_first", [True, False], ids=["title-first", "agent-first"])
def test_a_title_call_beside_the_agent_loop_is_its_own_segment_labelled_new_conversation(stack, title_first):
    r = httpx.post(stack.url + "/sessions", timeout=10).json()
    client = openai.OpenAI(base_url=r["base_url"], api_key="none", max_retries=0)

    def title():
        return client.chat.completions.create(model="m", messages=TITLE, max_tokens=12)

    if title_first:
        title()
    msgs = list(AGENT)
    first = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, max_tokens=64)
    msg = first.choices[0].message.model_dump(exclude_none=True)
    msgs.append(msg)
    msgs += [{"role": "tool", "tool_call_id": c["id"], "content": "a.txt"} for c in msg.get("tool_calls", [])]
    if not title_first:
        title()
    client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, max_tokens=64)
    assert httpx.post(f"{stack.url}/sessions/{r['session_id']}/finalize", json={"reward": 1.0}).status_code == 200
    segments = httpx.get(f"{stack.url}/sessions/{r['session_id']}/segments", timeout=10).json()
    by_reason = {s["boundary_reason"]: s for s in segments}
    assert sorted(by_reason) == ["new_conversation", "new_session"] and len(segments) == 2
    agent = by_reason["new_conversation" if title_first else "new_session"]
    assert len(agent["step_ids"]) == 2                     # the agent loop stays one Segment (TITO holds)
    assert len(by_reason["new_session" if title_first else "new_conversation"]["step_ids"]) == 1
    for s in segments:
        assert s["large_fields"]["routed_experts"]["rows"] == len(s["tokens"]) - 1
