"""langchain-openai's ChatOpenAI in a langgraph ReAct graph (model -> tools -> model) on a Proxy session."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("langchain_openai", reason="langchain-openai is not installed (pip install 'dressage[frameworks]')")
pytest.importorskip("langgraph", reason="langgraph is not installed (pip install 'dressage[frameworks]')")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402


def _graph(llm: ChatOpenAI, calls: list[tuple[int, int]]):
    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        calls.append((a, b))
        return a * b

    model = llm.bind_tools([multiply])

    def agent(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([multiply]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


@pytest.mark.parametrize("streaming, by_header, responses", [
    (False, False, False), (True, False, False), (False, True, False), (False, False, True), (True, False, True)],
    ids=["plain", "streamed", "session-header", "responses", "responses-streamed"])
def test_chat_openai_react_graph_runs_a_tool_round_trip_in_one_segment(new_session, streaming, by_header, responses):
    session = new_session(by_header=by_header)
    calls: list[tuple[int, int]] = []
    # stream_usage: ChatOpenAI asks for usage in streamed answers (stream_options.include_usage).
    llm = ChatOpenAI(model="dressage", base_url=session.base_url, api_key="none", http_client=session.log.client(),
                     default_headers=session.headers, max_tokens=256, temperature=0.7, streaming=streaming,
                     stream_usage=True, max_retries=0, use_responses_api=responses)
    out = _graph(llm, calls).invoke({"messages": [HumanMessage("What is 6 times 7?")]}, {"recursion_limit": 8})
    messages = out["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    first, result, final = messages[1], messages[2], messages[3]
    assert [c["name"] for c in first.tool_calls] == ["multiply"] and len(calls) == 1
    assert result.content == str(calls[0][0] * calls[0][1]) and result.tool_call_id == first.tool_calls[0]["id"]
    assert not final.tool_calls and final.text  # text of the content, a string or (Responses) blocks
    (seg,) = session.check_run(linear=True)
    if by_header:  # the Proxy made the session from the header on its first call
        info = httpx.get(f"{session.proxy_url}/sessions/{session.session_id}", timeout=30).json()
        assert info["metadata"]["session_source"] == "headers" and info["steps"] == len(seg["step_ids"]) == 2
    # langchain's own usage metadata agrees with the Proxy's answers.
    assert sum(m.usage_metadata["output_tokens"] for m in (first, final)) == session.log.completion_tokens
