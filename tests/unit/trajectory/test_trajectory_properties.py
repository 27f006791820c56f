"""Property-based checks of Segment invariants on random sessions."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dressage.trajectory import Sample, build_segments
from trajgen import L, K, call, expected_r3, new_session

# An operation: (kind, which step, tokens of the new response, tokens the environment adds)
op = st.tuples(
    st.sampled_from(["extend", "extend", "branch", "rewrite", "retry"]),
    st.integers(0, 10_000),
    st.lists(st.integers(30, 120), min_size=1, max_size=6),
    st.lists(st.integers(3, 25), min_size=0, max_size=4),
)


def _run(ops, r3_dtype):
    s = new_session(r3=True)
    rng_salt = 0
    call(s, [1, 2, 3], [40, 41])
    for kind, pick, resp, env in ops:
        rng_salt += 1
        steps = list(s.steps.values())
        if kind == "extend":
            parent = s.leaves()[pick % len(s.leaves())]
        elif kind in ("branch", "retry"):
            parent = steps[pick % len(steps)]
        else:
            call(s, [1, 2, 5 + pick % 7] + env, resp, salt=rng_salt, version=rng_salt % 3, r3_dtype=r3_dtype)
            continue
        prompt = np.concatenate([parent.full_ids, np.asarray(env if kind != "retry" else [], np.int32)])
        if kind == "retry":
            prompt = parent.prompt_ids
        call(s, prompt, resp, salt=rng_salt, version=rng_salt % 3, r3_dtype=r3_dtype)
    return s


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=0, max_size=12), st.sampled_from([np.uint8, np.uint16, np.int32]),
       st.sampled_from(["lineage", "timeline"]), st.booleans(), st.sampled_from(["once", "every"]))
def test_segment_invariants_hold_on_random_sessions(ops, r3_dtype, view, drop, shared):
    s = _run(ops, r3_dtype)
    segs = build_segments(s, view=view, drop_retry_orphans=drop, shared_prefix_loss=shared)
    assert segs
    trained: dict[int, int] = {}
    for seg in segs:
        T = len(seg.tokens)
        assert len(seg.loss_mask) == len(seg.token_versions) == seg.response_length == T - seg.prompt_length
        lp = seg.materialize("logprobs")
        r3 = seg.materialize("routed_experts")
        assert lp.shape == (seg.response_length,) and lp.dtype == np.float32
        assert r3.shape == (T - 1, L, K) and r3.dtype == np.int32       # R3 rows == T-1
        np.testing.assert_array_equal(r3, expected_r3(seg.tokens))
        assert np.all(lp[seg.loss_mask == 0] == 0.0)
        assert np.all(seg.token_versions[seg.loss_mask == 0] == -1)
        # each trained step's response sits where its tokens are, with its own logprobs
        for sid in seg.step_ids:
            st_ = s.steps[sid]
            lo = st_.prompt_len - seg.prompt_length
            assert seg.tokens[st_.prompt_len:st_.seq_len].tolist() == st_.response_ids.tolist()
            np.testing.assert_array_equal(lp[lo:lo + st_.response_len], st_.logprobs)
            assert np.all(seg.loss_mask[lo:lo + st_.response_len] == 1)
            trained[sid] = trained.get(sid, 0) + 1
        # Segment pieces point at the steps' own arrays: no copies
        step_arrays = {id(x.routed_experts) for x in s.steps.values()}
        assert all(id(p.value) in step_arrays for p in seg.large["routed_experts"])
        sample = Sample.from_segment(seg)
        assert sample.is_restored and sample.rollout_routed_experts.shape == (T - 1, L, K)
    orphans = s.retry_orphans() if drop else set()
    # every kept step is trained by at least one Segment
    assert set(trained) == set(s.steps) - orphans
    if shared == "once" or view == "timeline":
        # ... and by exactly one: the loss masks add up to the tokens the engine generated
        assert all(n == 1 for n in trained.values())
        generated = sum(x.response_len for i, x in s.steps.items() if i not in orphans)
        assert sum(int(seg.loss_mask.sum()) for seg in segs) == generated
    # exactly one Segment is labelled as opening the session: the one that trains its first call
    opening = [seg for seg in segs if seg.boundary_reason == "new_session"]
    if 0 in orphans:
        assert not opening
    else:
        assert len(opening) == 1 and 0 in opening[0].step_ids
    if view == "lineage":
        assert len(segs) == len([x for x in s.steps if x not in orphans and not
                                 any(c not in orphans for c in s.children.get(x, []))])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=0, max_size=12), st.sampled_from(["lineage", "timeline"]))
def test_each_generated_token_is_trained_once_by_default(ops, view):
    s = _run(ops, np.int32)
    segs = build_segments(s, view=view)
    assert sum(int(seg.loss_mask.sum()) for seg in segs) == sum(x.response_len for x in s.steps.values())
    owner: dict[int, int] = {}
    for seg in segs:
        for sid in seg.step_ids:
            assert sid not in owner, f"step {sid} trained by Segments {owner.get(sid)} and {seg.index}"
            owner[sid] = seg.index
        # the untrained part of the sequence is prompt: context the Segment does not train
        assert seg.tokens[:seg.prompt_length].tolist() == s.steps[seg.step_ids[0]].prompt_ids.tolist()
