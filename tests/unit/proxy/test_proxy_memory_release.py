"""What a finished session gives back: chat text, tool schemas and token slack go at seal; the
Segments built afterwards are the ones built from the unsealed session, value for value."""

import asyncio
import copy
import sys

import numpy as np
import pytest

from dressage.errors import SessionStateError
from dressage.proxy.engines import generation
from dressage.trajectory import Session, build_segments
from dressage.trajectory.segment import segment_ends

_TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]


def _session(turns: int, seed: int = 0) -> Session:
    rng = np.random.default_rng(seed)
    s = Session("s", record_logprobs=True)
    ids = rng.integers(0, 50_000, 100, dtype=np.int32)
    history: list = [{"role": "user", "content": "q" * 300}]
    for t in range(turns):
        resp = rng.integers(0, 50_000, 40, dtype=np.int32)
        reply = {"role": "assistant", "content": f"a{t}"}
        s.add_step(ids.copy(), resp, logprobs=-rng.random(len(resp), dtype=np.float32),
                   messages=[dict(m) for m in history], tools=copy.deepcopy(_TOOLS),  # a fresh parse each call
                   metadata={"assistant_message": reply, "weight_version_label": "v0"})
        history += [reply, {"role": "tool", "content": f"r{t}"}]
        ids = np.concatenate([ids, resp, rng.integers(0, 50_000, 10, dtype=np.int32)])
    return s


def _plain(segments):
    return [(g.step_ids, g.tokens.tolist(), g.prompt_length, g.loss_mask.tolist(), g.token_versions.tolist(),
             g.boundary_reason, g.materialize("logprobs").tolist()) for g in segments]


@pytest.mark.parametrize("view", ["lineage", "timeline"])
def test_seal_drops_chat_state_and_keeps_segments_identical(view):
    s = _session(5)
    before = _plain(build_segments(s, view))
    tape = s.steps[0]._tape
    assert tape.buf.shape[0] > tape.used  # slack kept for more turns
    s.finalize(1.0)
    s.seal()
    for st in s.steps.values():
        assert st.messages is None and st.tools is None
        assert "assistant_message" not in st.metadata
        assert st.metadata["weight_version_label"] == "v0"  # the rest of the metadata stays
    tape = s.steps[4]._tape
    assert tape.buf.shape[0] == tape.used == s.steps[4].seq_len  # no slack left
    assert all(np.shares_memory(st.full_ids, tape.buf) for st in s.steps.values())
    assert _plain(build_segments(s, view)) == before


@pytest.mark.parametrize("view", ["lineage", "timeline"])
def test_seal_keeps_the_conversation_of_the_steps_that_end_a_segment_only(view):
    s = _session(4)
    branch = s.add_step(np.concatenate([s.steps[1].full_ids, np.array([7, 8], np.int32)]), np.array([5, 6], np.int32),
                        logprobs=np.zeros(2, np.float32), messages=[{"role": "user", "content": "other"}],
                        tools=copy.deepcopy(_TOOLS), metadata={"assistant_message": {"role": "assistant",
                                                                                    "content": "b"}})
    ends = segment_ends(s, view)
    assert ends == {seg.step_ids[-1] for seg in build_segments(s, view)} == {3, branch.step_id}
    kept = {i: (s.steps[i].messages, s.steps[i].tools, s.steps[i].metadata["assistant_message"]) for i in ends}
    s.finalize(1.0)
    s.seal(keep=ends)
    for st in s.steps.values():
        if st.step_id in ends:
            assert (st.messages, st.tools, st.metadata["assistant_message"]) == kept[st.step_id]
        else:
            assert st.messages is None and st.tools is None and "assistant_message" not in st.metadata
    assert s.steps[branch.step_id].metadata["assistant_message"] == {"role": "assistant", "content": "b"}
    assert len(s.steps[3].messages) == 7  # the whole history the last turn was sent, not one message of it


def test_seal_refuses_an_active_session():
    s = _session(2)
    with pytest.raises(SessionStateError, match="still active"):
        s.seal()
    assert s.steps[1].messages is not None


def test_equal_tool_lists_share_the_parents_object():
    s = _session(4)
    first = s.steps[0].tools
    assert all(s.steps[i].tools is first for i in range(4))
    other = [{"type": "function", "function": {"name": "other"}}]
    b = s.add_step(s.steps[3].full_ids.copy(), np.array([1, 2], np.int32), logprobs=np.zeros(2, np.float32),
                   tools=other)
    assert b.tools is other and b.tools == other


def test_the_engine_call_runs_in_the_callers_task():
    async def call():
        return asyncio.current_task()

    async def main():
        inner = await generation._within(5.0, call())
        return inner, asyncio.current_task()

    inner, outer = asyncio.run(main())
    if sys.version_info >= (3, 11):
        assert inner is outer  # no task of its own holding the engine's body as its result
    else:
        assert inner is not None


def test_the_deadline_still_applies():
    async def slow():
        await asyncio.sleep(10)

    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(generation._within(0.05, slow()))
