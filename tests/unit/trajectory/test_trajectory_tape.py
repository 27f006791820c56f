"""Token tapes: a lineage's steps share one buffer; Segments are what they were with copies."""

import tracemalloc

import numpy as np
import pytest

from dressage.trajectory import Session, build_segments


def _session(turns: int, rng: np.random.Generator, *, messages: bool = False) -> tuple[Session, list]:
    s = Session("s", record_logprobs=True)
    ids = rng.integers(0, 50_000, 200, dtype=np.int32)
    history: list = [{"role": "user", "content": "q" * 400}]
    copies = []
    for t in range(turns):
        resp = rng.integers(0, 50_000, 120, dtype=np.int32)
        lp = -rng.random(len(resp), dtype=np.float32)
        msgs = [dict(m) for m in history] if messages else None  # a fresh parse, as each request is
        rec = s.add_step(ids.copy(), resp, logprobs=lp, messages=msgs,
                         metadata={"assistant_message": {"role": "assistant", "content": f"a{t}"}})
        copies.append((ids.copy(), resp.copy()))
        history += [{"role": "assistant", "content": f"a{t}"}, {"role": "user", "content": f"tool {t} " * 50}]
        ids = np.concatenate([ids, resp, rng.integers(0, 50_000, 30, dtype=np.int32)])
        assert rec.step_id == t
    return s, copies


def test_ten_turns_share_one_buffer_and_keep_their_values():
    s, copies = _session(10, np.random.default_rng(0))
    steps = [s.steps[i] for i in range(10)]
    for st, (p, r) in zip(steps, copies):
        assert np.array_equal(st.prompt_ids, p) and np.array_equal(st.response_ids, r)
        assert np.array_equal(st.full_ids, np.concatenate([p, r]))
        assert st.prompt_ids.dtype == np.int32 and not st.prompt_ids.flags.writeable
        assert np.shares_memory(st.prompt_ids, steps[-1].full_ids)
    assert len({id(st._tape) for st in steps}) == 1
    tape = steps[0]._tape
    assert tape.used == steps[-1].seq_len == 200 + 10 * 120 + 9 * 30
    # The buffer holds the lineage once (plus bounded slack), not the sum of the prompts.
    assert tape.buf.nbytes <= 2 * 4 * tape.used
    old = sum(st.prompt_ids.nbytes + st.full_ids.nbytes for st in steps)  # a prompt copy + full_ids each
    assert old > 9 * tape.buf.nbytes


def test_branch_gets_its_own_tape_and_the_trunk_is_untouched():
    s, copies = _session(3, np.random.default_rng(1))
    trunk = s.steps[2]._tape.buf[:s.steps[2].seq_len].copy()
    # A retry of step 1's call: branches off step 0, whose tape already goes on.
    p1, _ = copies[1]
    b = s.add_step(p1, np.array([7, 8, 9], np.int32), logprobs=np.zeros(3, np.float32))
    assert b.parent_id == 0 and b.branch_from == 0
    assert b._tape is not s.steps[0]._tape
    assert np.array_equal(b.full_ids, np.concatenate([p1, [7, 8, 9]]))
    assert np.array_equal(s.steps[2]._tape.buf[:s.steps[2].seq_len], trunk)
    assert not np.shares_memory(b.full_ids, s.steps[2].full_ids)


def _plain(segments):
    return [(g.step_ids, g.tokens.tolist(), g.prompt_length, g.loss_mask.tolist(), g.token_versions.tolist(),
             g.boundary_reason, g.materialize("logprobs").tolist()) for g in segments]


@pytest.mark.parametrize("view", ["lineage", "timeline"])
def test_segments_equal_a_session_built_from_copies(view):
    s, copies = _session(6, np.random.default_rng(2))
    ref = Session("s", record_logprobs=True)
    for i, (p, r) in enumerate(copies):
        st = s.steps[i]
        rec = ref.prepare_step(ref.route(p), prompt_ids=p, response_ids=r, logprobs=st.logprobs)
        ref.steps[rec.step_id] = rec  # the old layout: every step its own arrays
        if rec.parent_id is not None:
            ref.children.setdefault(rec.parent_id, []).append(rec.step_id)
    ref._next_lineage = 1
    assert _plain(build_segments(s, view)) == _plain(build_segments(ref, view))


def test_messages_reuse_the_parents_objects():
    s, _ = _session(5, np.random.default_rng(3), messages=True)
    last = s.steps[4].messages
    assert len(last) == 9
    assert last[0] is s.steps[0].messages[0]
    assert last[1] is s.steps[0].metadata["assistant_message"]
    assert [m["content"] for m in last[:3]] == ["q" * 400, "a0", "tool 0 " * 50]


def test_bytes_held_per_session_are_linear_in_its_tokens():
    rng = np.random.default_rng(4)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    s, copies = _session(10, rng)
    del copies
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    held = sum(st.size_diff for st in after.compare_to(before, "filename") if st.size_diff > 0)
    total = s.steps[9].seq_len  # 2,670 tokens in the lineage
    responses = sum(st.response_len for st in s.steps.values())
    # The tape (int32, <= 2x slack), logprobs and versions (4 B a response token each), and a
    # fixed cost per step; the old layout held every prompt twice (prompt_ids + full_ids): 10x more.
    bound = 2 * 4 * total + 2 * 4 * responses + 10 * 4096
    quadratic = 2 * 4 * sum(st.seq_len for st in s.steps.values())
    assert held <= bound < quadratic


def test_a_sealed_session_is_freed_without_the_cycle_collector():
    """Once sealed, no step is in a reference cycle with its tape: dropping the session frees its
    steps and token buffers at once, not at the next full garbage collection."""
    import gc
    import weakref

    s, copies = _session(4, np.random.default_rng(3))
    s.state = "finalized"
    s.seal()
    for st, (p, r) in zip(s.steps.values(), copies):  # the views still read the sealed buffer
        assert np.array_equal(st.prompt_ids, p) and np.array_equal(st.response_ids, r)
    buf = weakref.ref(s.steps[3]._tape.buf)
    del st
    gc.disable()
    try:
        del s
        assert buf() is None
    finally:
        gc.enable()
