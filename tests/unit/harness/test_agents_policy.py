"""Agent decisions: seeded per session, independent of timing; the conversation state machine."""

from __future__ import annotations

import json

import pytest

from dressage.errors import SessionStateError
from dressage.harness.agents import AgentConfig, ChatReply, Conversation, SessionPolicy, ToolCall, make_prompts
from dressage.harness.agents.policy import needs_compression


def _decisions(config, group, sample, n=12):
    policy = SessionPolicy(config, group, sample, ("cache",))
    return [policy.next_turn(retry_candidates=t) for t in range(n)]


def test_decisions_are_a_function_of_seed_group_and_sample():
    cfg = AgentConfig(retry_rate=0.5, seed=7)
    assert _decisions(cfg, 2, 3) == _decisions(cfg, 2, 3)
    assert _decisions(cfg, 2, 3) != _decisions(cfg, 2, 4)
    assert _decisions(cfg, 2, 3) != _decisions(cfg, 3, 3)
    assert _decisions(cfg, 2, 3) != _decisions(AgentConfig(retry_rate=0.5, seed=8), 2, 3)


def test_the_stream_stays_aligned_whatever_earlier_turns_decided():
    # The same session with and without retry candidates draws the same call seeds and follow-ups.
    cfg = AgentConfig(retry_rate=0.9, seed=1)
    a, b = SessionPolicy(cfg, 0, 0), SessionPolicy(cfg, 0, 0)
    da = [a.next_turn(retry_candidates=0) for _ in range(10)]
    db = [b.next_turn(retry_candidates=5) for _ in range(10)]
    assert [d.call_seed for d in da] == [d.call_seed for d in db]
    assert [d.followup for d in da] == [d.followup for d in db]
    assert all(d.retry_from is None for d in da)
    assert any(d.retry_from is not None for d in db)


def test_retry_targets_have_a_parent_and_the_rate_is_respected():
    cfg = AgentConfig(retry_rate=0.3, seed=0)
    picks = [d for s in range(200) for d in _decisions(cfg, 0, s, n=6)[3:]]
    chosen = [d.retry_from for d in picks if d.retry_from is not None]
    assert 0.2 < len(chosen) / len(picks) < 0.4
    # turns 3..5 were given 3..5 candidates: targets are epoch indices 1..candidates, never 0
    assert min(chosen) == 1 and max(chosen) <= 5
    assert all(d.retry_from is None for d in _decisions(AgentConfig(retry_rate=0.0), 0, 0))


def test_compression_triggers_at_the_threshold():
    cfg = AgentConfig(context_length=1000, compression_threshold=0.8, max_tokens=100)
    assert not needs_compression(cfg, 700, 99)
    assert needs_compression(cfg, 700, 100)


def _text_reply(text="The cache is ready.", prompt_tokens=100, completion_tokens=20):
    return ChatReply({"role": "assistant", "content": text}, (), "stop", prompt_tokens, completion_tokens)


def _tool_reply(call_id="call_0", prompt_tokens=100, completion_tokens=20, **args):
    call = {"id": call_id, "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps(args)}}
    return ChatReply({"role": "assistant", "content": None, "tool_calls": [call]},
                     (ToolCall(call_id, "calculator", json.dumps(args)),), "tool_calls",
                     prompt_tokens, completion_tokens)


def test_tool_calls_are_answered_with_tool_messages_after_the_reply_as_returned():
    prompt = make_prompts(1, seed=0)[0]
    conv = Conversation(prompt, AgentConfig(max_turns=3), 0, 0)
    first = conv.next_request()
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert first.tools is not None and first.seed is not None
    reply = _tool_reply(op="add", a=2, b=3)
    conv.observe(reply)
    second = conv.next_request()
    assert second.messages[:2] == first.messages
    assert second.messages[2] is reply.message
    assert second.messages[3] == {"role": "tool", "tool_call_id": "call_0", "content": "5"}
    assert conv.tool_calls == 1 and conv.tool_errors == 0
    conv.observe(_text_reply())
    third = conv.next_request()
    assert third.messages[-2] == {"role": "assistant", "content": "The cache is ready."}
    assert third.messages[-1]["role"] == "user"
    assert third.messages[-1]["content"] == second.decision.followup
    conv.observe(_text_reply())
    assert conv.done and conv.end_reason == "max_turns" and conv.turns == 3
    with pytest.raises(SessionStateError):
        conv.next_request()


def test_no_tools_offered_when_tool_use_is_off_and_no_seed_when_asked():
    conv = Conversation(make_prompts(1)[0], AgentConfig(tools=False, send_seed=False), 0, 0)
    plan = conv.next_request()
    assert plan.tools is None and plan.seed is None


def test_a_retry_resends_an_earlier_request_and_continues_from_its_reply():
    cfg = AgentConfig(max_turns=30, retry_rate=0.5, seed=11)
    conv = Conversation(make_prompts(1)[0], cfg, 0, 0)
    plans, replies = [], []
    while not conv.done:
        plans.append(conv.next_request())
        replies.append(_text_reply(text=f"reply {len(plans)}"))
        conv.observe(replies[-1])
    assert conv.retries == sum(p.decision.retry_from is not None for p in plans) > 3
    for i, plan in enumerate(plans[:-1]):
        if plan.decision.retry_from is None:
            continue
        # Re-sent verbatim: an earlier request, never the root one (which has no parent to branch from).
        assert any(plan.messages == p.messages for p in plans[1:i])
        assert plan.messages != plans[0].messages
        nxt = plans[i + 1]
        if nxt.decision.retry_from is None:
            assert nxt.messages[:len(plan.messages) + 1] == plan.messages + [replies[i].message]


def test_compression_replaces_the_history_and_a_retry_never_crosses_it():
    cfg = AgentConfig(max_turns=12, context_length=1000, compression_threshold=0.5, max_tokens=100,
                      retry_rate=0.4, seed=5)
    prompt = make_prompts(1)[0]
    conv = Conversation(prompt, cfg, 0, 0)
    epoch_start, requests = 0, []
    while not conv.done:
        plan = conv.next_request()
        requests.append(plan.messages)
        if plan.decision.retry_from is not None:
            assert plan.messages in requests[epoch_start + 1:-1]
        before = conv.compressions
        # Every third turn reports a near-full context.
        conv.observe(_text_reply(prompt_tokens=600 if len(requests) % 3 == 0 else 100))
        if conv.compressions > before:
            epoch_start = len(requests)
            assert [m["role"] for m in conv.messages] == ["system", "user"]
            assert conv.messages[1]["content"].startswith(prompt.user)
            assert "compressed" in conv.messages[1]["content"]
    assert conv.compressions >= 2 and conv.end_reason == "max_turns"


def test_without_compression_a_full_context_ends_the_session():
    cfg = AgentConfig(max_turns=10, context_length=1000, max_tokens=100, compression=False)
    conv = Conversation(make_prompts(1)[0], cfg, 0, 0)
    conv.next_request()
    conv.observe(_text_reply(prompt_tokens=100))
    conv.next_request()
    conv.observe(_text_reply(prompt_tokens=900))
    assert conv.done and conv.end_reason == "context_limit" and conv.compressions == 0


def test_a_full_context_right_after_compression_ends_the_session_instead_of_looping():
    cfg = AgentConfig(max_turns=10, context_length=1000, max_tokens=100)
    conv = Conversation(make_prompts(1)[0], cfg, 0, 0)
    for _ in range(2):
        conv.next_request()
        conv.observe(_text_reply(prompt_tokens=100))
    conv.next_request()
    conv.observe(_text_reply(prompt_tokens=900))
    assert conv.compressions == 1 and not conv.done
    conv.next_request()
    conv.observe(_text_reply(prompt_tokens=900))
    assert conv.done and conv.end_reason == "context_limit" and conv.compressions == 1


def test_the_whole_conversation_replays_exactly_for_a_seed():
    def run(seed):
        cfg = AgentConfig(max_turns=15, retry_rate=0.3, context_length=2000, max_tokens=100, seed=seed)
        conv = Conversation(make_prompts(3, seed=1)[2], cfg, 2, 1)
        log = []
        while not conv.done:
            plan = conv.next_request()
            log.append((json.dumps(plan.messages), plan.seed))
            n = len(log)
            conv.observe(_tool_reply(call_id=f"c{n}", op="add", a=n, b=1) if n % 2 else
                         _text_reply(prompt_tokens=400 * (n % 5)))
        return log, conv.reward(), conv.retries, conv.compressions
    assert run(3) == run(3)
    assert run(3) != run(4)


def test_observe_without_request_is_an_error():
    conv = Conversation(make_prompts(1)[0], AgentConfig(), 0, 0)
    with pytest.raises(SessionStateError):
        conv.observe(_text_reply())
    conv.next_request()
    with pytest.raises(SessionStateError):
        conv.next_request()
