"""Trajectory semantics with values: lineage routing, TITO, branches, rewrites, partial rollout."""

import numpy as np
import pytest

from dressage.errors import FieldShapeError, SessionStateError, TrajectoryError, UnknownStepError
from dressage.trajectory import PartialResponse, RouteDecision, Sample, Session, build_segments
from trajgen import L, K, call, expected_r3, fake_logprobs, new_session

SYS = [1, 2, 3, 4]          # system + user prompt
EOS_NL = [9, 10]            # template glue after an assistant turn
TOOL = [20, 21, 22]         # a tool result


def ids(*parts):
    return np.concatenate([np.asarray(p, dtype=np.int32) for p in parts])


def test_single_turn_segment_has_slime_fields():
    s = new_session()
    call(s, SYS, [30, 31, 9])
    (seg,) = build_segments(s)
    assert seg.tokens.tolist() == SYS + [30, 31, 9]
    assert seg.response_length == 3 and seg.prompt_length == 4
    assert seg.loss_mask.tolist() == [1, 1, 1]
    np.testing.assert_array_equal(seg.materialize("logprobs"), fake_logprobs(np.array([30, 31, 9]), 0))
    r3 = seg.materialize("routed_experts")
    assert r3.dtype == np.int32 and r3.shape == (len(seg.tokens) - 1, L, K)
    np.testing.assert_array_equal(r3, expected_r3(seg.tokens))
    assert seg.boundary_reason == "new_session"


def test_multi_turn_tito_marks_tool_and_glue_tokens_as_environment():
    s = new_session()
    a1 = call(s, SYS, [30, 31], version=1, salt=1)
    p2 = ids(SYS, [30, 31], EOS_NL, TOOL)
    a2 = call(s, p2, [40, 41, 42], version=2, salt=2)
    assert a2.parent_id == a1.step_id and a2.lineage_id == a1.lineage_id
    assert a2.routed_experts_start == a1.end_row          # only new rows were requested
    assert a2.routed_experts.shape[0] == len(p2) + 3 - 1 - a1.end_row
    (seg,) = build_segments(s)
    assert seg.tokens.tolist() == p2.tolist() + [40, 41, 42]
    assert seg.response_length == 2 + 5 + 3
    assert seg.loss_mask.tolist() == [1, 1, 0, 0, 0, 0, 0, 1, 1, 1]
    lp = seg.materialize("logprobs")
    assert lp[2:7].tolist() == [0.0] * 5
    np.testing.assert_array_equal(lp[:2], fake_logprobs(np.array([30, 31]), 1))
    np.testing.assert_array_equal(lp[7:], fake_logprobs(np.array([40, 41, 42]), 2))
    np.testing.assert_array_equal(seg.materialize("routed_experts"), expected_r3(seg.tokens))
    assert seg.token_versions.tolist() == [1, 1, -1, -1, -1, -1, -1, 2, 2, 2]
    assert seg.version_span() == (1, 2)


def test_branch_shares_parent_data_and_records_branch_from():
    s = new_session()
    a1 = call(s, SYS, [30, 31])
    a2 = call(s, ids(SYS, [30, 31], TOOL), [40])
    b = call(s, ids(SYS, [30, 31], [23, 24]), [50, 51])   # retried turn 2 with another tool result
    assert a2.parent_id == a1.step_id and b.parent_id == a1.step_id
    assert b.branch_from == a1.step_id and b.lineage_id != a1.lineage_id
    seg_a, seg_b = build_segments(s)
    # Default: the shared turn a1 is trained by the first Segment only; the branch's Segment has it
    # as prompt (context), so each generated token has loss 1 exactly once.
    assert seg_a.step_ids == (0, 1) and seg_b.step_ids == (2,)
    assert seg_b.branch_from == a1.step_id and seg_b.boundary_reason == "branch"
    assert seg_b.prompt_length == b.prompt_len and seg_b.loss_mask.tolist() == [1, 1]
    assert int(seg_a.loss_mask.sum() + seg_b.loss_mask.sum()) == a1.response_len + a2.response_len + b.response_len
    # The shared prefix is the same object in both Segments, not a copy.
    assert seg_a.large["routed_experts"][0].value is seg_b.large["routed_experts"][0].value is a1.routed_experts
    for seg in (seg_a, seg_b):
        np.testing.assert_array_equal(seg.materialize("routed_experts"), expected_r3(seg.tokens))
    # "every": each branch trains its whole root-to-leaf chain (tree RL); labels stay the same.
    ev_a, ev_b = build_segments(s, shared_prefix_loss="every")
    assert ev_a.step_ids == (0, 1) and ev_b.step_ids == (0, 2) and ev_b.boundary_reason == "branch"
    assert ev_b.prompt_length == len(SYS) and ev_b.loss_mask.tolist() == [1, 1, 0, 0, 1, 1]
    assert ev_a.large["logprobs"][0].value is ev_b.large["logprobs"][0].value is a1.logprobs


def test_append_after_branch_extends_the_branch_lineage():
    s = new_session()
    call(s, SYS, [30])
    call(s, ids(SYS, [30], TOOL), [40])
    b = call(s, ids(SYS, [30], [23]), [50])
    c = call(s, ids(SYS, [30], [23], [50], TOOL), [60])
    assert c.parent_id == b.step_id and c.lineage_id == b.lineage_id and c.branch_from is None
    assert len(build_segments(s)) == 2


def test_history_rewrite_gives_two_segments_with_reason():
    s = new_session()
    call(s, SYS, [30, 31])
    call(s, ids(SYS, [30, 31], TOOL), [40, 41])
    compressed = ids(SYS, [77, 78])                      # agent summarised the history
    r = call(s, compressed, [80])
    assert r.parent_id is None and r.boundary.reason == "history_rewrite"
    segs = build_segments(s)
    assert [seg.boundary_reason for seg in segs] == ["new_session", "history_rewrite"]
    assert segs[1].tokens.tolist() == compressed.tolist() + [80]
    assert segs[1].prompt_length == len(compressed)
    for seg in segs:
        assert seg.materialize("routed_experts").shape[0] == len(seg.tokens) - 1


def test_tool_schema_change_is_a_boundary():
    s = new_session()
    call(s, SYS, [30], tools=[{"name": "a"}])
    r = call(s, ids(SYS, [30], TOOL), [40], tools=[{"name": "b"}])
    assert r.boundary.reason == "tool_schema_change"
    assert len(build_segments(s)) == 2


def test_near_miss_classification():
    s = Session("n", special_ids={9}, decode=lambda a: bytes(int(t) for t in a).decode("latin-1"))
    call(s, SYS, [30, 31])
    # the reply came back with a special token where the engine had produced text: template drift
    r = s.route(ids(SYS, [30, 9], TOOL))
    assert r.kind == "create" and r.boundary.reason == "tito_mismatch" and r.boundary.drift == "template"
    # same text, other ids
    s2 = Session("r", decode=lambda a: "".join({30: "ab", 31: "c", 40: "a", 41: "bc"}.get(int(t), "?") for t in a))
    call(s2, SYS, [30, 31])
    r2 = s2.route(ids(SYS, [40, 41], TOOL))
    assert r2.boundary.reason == "tito_mismatch" and r2.boundary.drift == "retokenization"
    r3 = s2.route(ids(SYS, [55], TOOL))
    assert r3.boundary.drift == "other"


def test_retry_orphans_are_dropped_on_request():
    s = new_session()
    call(s, SYS, [30])
    orphan = call(s, ids(SYS, [30], TOOL), [40])          # failed downstream, agent retried
    retry = call(s, ids(SYS, [30], TOOL), [41])
    call(s, ids(SYS, [30], TOOL, [41], TOOL), [50])
    assert s.retry_orphans() == {orphan.step_id}
    assert len(build_segments(s)) == 2
    (seg,) = build_segments(s, drop_retry_orphans=True)
    assert seg.step_ids == (0, retry.step_id, 3)


def test_timeline_view_cuts_when_prompt_stops_extending():
    s = new_session()
    call(s, SYS, [30])
    call(s, ids(SYS, [30], TOOL), [40])
    call(s, ids(SYS, [30], [23]), [50])                  # branch: does not extend step 1
    call(s, ids(SYS, [30], [23], [50], TOOL), [60])
    segs = build_segments(s, view="timeline")
    assert [seg.step_ids for seg in segs] == [(0, 1), (2, 3)]
    assert segs[1].boundary_reason == "branch"
    assert segs[1].prompt_length == len(SYS) + 1 + 1      # earlier history is prompt here
    for seg in segs:
        np.testing.assert_array_equal(seg.materialize("routed_experts"), expected_r3(seg.tokens))
        assert len(seg.loss_mask) == seg.response_length


def test_partial_rollout_gives_one_response_with_per_token_versions():
    s = new_session()
    prompt = np.array(SYS, dtype=np.int32)
    part = PartialResponse(len(prompt))
    out1 = np.array([30, 31, 32], dtype=np.int32)
    full1 = ids(prompt, out1)
    part.add_chunk(out1, fake_logprobs(out1, 0), expected_r3(full1, start=0), version=3)
    assert part.next_routed_experts_start == len(prompt) + 3 - 1
    out2 = np.array([33, 9], dtype=np.int32)               # resumed after the weight update
    full2 = ids(full1, out2)
    part.add_chunk(out2, fake_logprobs(out2, 0), expected_r3(full2, start=part.next_routed_experts_start),
                   version=4)
    resp, lps, routed, versions = part.merge()
    decision = s.route(prompt)
    s.commit_step(decision, prompt_ids=prompt, response_ids=resp, logprobs=lps, routed_experts=routed,
                  token_versions=versions)
    (seg,) = build_segments(s)
    assert seg.token_versions.tolist() == [3, 3, 3, 4, 4]
    assert seg.version_runs() == [(3, 3), (4, 2)]
    assert seg.version_span() == (3, 4)
    np.testing.assert_array_equal(seg.materialize("routed_experts"), expected_r3(seg.tokens))
    assert Sample.from_segment(seg).weight_versions == ["3", "4"]


def test_compact_r3_dtype_is_restored_to_int32():
    s = new_session()
    call(s, SYS, [30, 31], r3_dtype=np.uint8)
    (seg,) = build_segments(s)
    assert seg.large["routed_experts"][0].value.dtype == np.uint8
    r3 = seg.materialize("routed_experts")
    assert r3.dtype == np.int32
    np.testing.assert_array_equal(r3, expected_r3(seg.tokens))


def _snapshot(s: Session):
    return (len(s.steps), {k: list(v) for k, v in s.children.items()}, s.state, s._next_lineage)


@pytest.mark.parametrize("kwargs, err, msg", [
    (dict(logprobs=np.zeros(2, np.float32)), FieldShapeError, "logprobs"),
    (dict(routed_experts=np.zeros((3, L, K), np.int32)), FieldShapeError, "routed_experts"),
    (dict(routed_experts=np.zeros((4, L + 1, K), np.int32)), FieldShapeError, "num_layers"),
    (dict(token_versions=np.zeros(2, np.int32)), FieldShapeError, "token_versions"),
    (dict(response_ids=np.zeros((3, 1), np.int32)), FieldShapeError, "1-D"),
    (dict(routed_experts=np.zeros((4, L, K), np.float32)), FieldShapeError, "integers"),
])
def test_bad_step_input_is_typed_error_and_session_unchanged(kwargs, err, msg):
    s = new_session()
    call(s, SYS, [30])
    before = _snapshot(s)
    prompt = ids(SYS, [30], [5])
    base = dict(prompt_ids=prompt, response_ids=np.array([1, 2, 3], np.int32),
                logprobs=np.zeros(3, np.float32), routed_experts=np.zeros((len(prompt) + 3 - 1 - 4, L, K), np.int32))
    base.update(kwargs)
    with pytest.raises(err, match=msg):
        s.commit_step(s.route(prompt), **base)
    assert _snapshot(s) == before


def test_unknown_parent_and_stale_decision_are_rejected():
    s = new_session()
    call(s, SYS, [30])
    with pytest.raises(UnknownStepError):
        s.commit_step(RouteDecision("append", 99, 0), prompt_ids=SYS, response_ids=[1], logprobs=[0.0],
                      routed_experts=np.zeros((4, L, K), np.int32))
    with pytest.raises(TrajectoryError, match="prefix"):
        s.commit_step(RouteDecision("append", 0, 4), prompt_ids=[7, 7, 7, 7, 7, 7], response_ids=[1],
                      logprobs=[0.0], routed_experts=np.zeros((2, L, K), np.int32))
    assert len(s.steps) == 1


def test_finalized_session_takes_no_more_steps():
    s = new_session()
    call(s, SYS, [30])
    s.finalize(reward=1.0)
    with pytest.raises(SessionStateError, match="finalized"):
        call(s, ids(SYS, [30], TOOL), [40])
    with pytest.raises(SessionStateError):
        s.finalize()
    assert len(s.steps) == 1 and s.reward == 1.0


def test_concurrent_append_becomes_branch_at_commit():
    s = new_session()
    call(s, SYS, [30])
    p = ids(SYS, [30], TOOL)
    d1, d2 = s.route(p), s.route(p)
    assert d1.kind == d2.kind == "append"
    full = ids(p, [40])
    r1 = s.commit_step(d1, prompt_ids=p, response_ids=[40], logprobs=[0.0],
                       routed_experts=expected_r3(full, start=d1.routed_experts_start))
    r2 = s.commit_step(d2, prompt_ids=p, response_ids=[41], logprobs=[0.0],
                       routed_experts=expected_r3(ids(p, [41]), start=d2.routed_experts_start))
    assert r1.branch_from is None and r2.branch_from == 0


def test_r3_off_session_rejects_routed_experts_and_builds_without_them():
    s = new_session(r3=False)
    call(s, SYS, [30])
    (seg,) = build_segments(s)
    assert "routed_experts" not in seg.large
    with pytest.raises(FieldShapeError, match="Routing Replay off"):
        s.commit_step(s.route(ids(SYS, [30], [1])), prompt_ids=ids(SYS, [30], [1]), response_ids=[2],
                      logprobs=[0.0], routed_experts=np.zeros((1, 1, 1), np.int32))


def test_prepared_step_is_refused_once_the_session_moved_on():
    s = new_session()
    call(s, SYS, [30])
    p = ids(SYS, [30], TOOL)
    d = s.route(p)
    rec = s.prepare_step(d, prompt_ids=p, response_ids=[40], logprobs=[0.0],
                         routed_experts=expected_r3(ids(p, [40]), start=d.routed_experts_start))
    assert len(s.steps) == 1                                    # prepare changes nothing
    call(s, p, [41])                                            # another call got in first
    with pytest.raises(TrajectoryError, match="changed since"):
        s.insert_step(rec)
    assert len(s.steps) == 2


def test_rebased_record_attaches_where_the_session_stands_now():
    s = new_session()
    call(s, SYS, [30])
    p = ids(SYS, [30], TOOL)
    d = s.route(p)
    r3 = expected_r3(ids(p, [40]), start=d.routed_experts_start)
    rec = s.prepare_step(d, prompt_ids=p, response_ids=[40], logprobs=[0.0], routed_experts=r3)
    assert s.rebase(rec) is rec                                 # nothing moved: the record itself
    assert (rec.step_id, rec.lineage_id, rec.branch_from) == (1, 0, None)
    call(s, p, [41])                                            # another call got in first
    stored = np.zeros(r3.shape, np.uint8)                       # stands for the stored rows
    placed = s.rebase(rec, routed_experts=stored)
    assert (placed.step_id, placed.lineage_id, placed.branch_from) == (2, 1, 0)   # the append is a branch now
    assert placed.routed_experts is stored and placed.parent_id == 0 and placed.metadata is not rec.metadata
    assert (rec.step_id, rec.lineage_id, rec.branch_from) == (1, 0, None) and rec.routed_experts is r3
    s.insert_step(placed)
    assert [st.branch_from for st in s.steps.values()] == [None, None, 0]
    assert s.children[0] == [1, 2]


def test_dropped_reply_is_trained_once_and_labelled_branch():
    # [user] -> R0; [user, R0, user x] -> R1; [user, R0, user x, user y] -> R2 (R1 dropped, as an
    # agent does after a format error): R0 is shared context for the third call.
    s = new_session()
    user, x, y = list(range(1, 21)), list(range(100, 110)), list(range(120, 130))
    r0, r1, r2 = [[200 + k * 50 + i for i in range(40)] for k in range(3)]
    call(s, user, r0)
    call(s, ids(user, r0, x), r1)
    call(s, ids(user, r0, x, y), r2)
    for view in ("lineage", "timeline"):
        segs = build_segments(s, view=view)
        assert [seg.boundary_reason for seg in segs] == ["new_session", "branch"]
        assert sum(int(seg.loss_mask.sum()) for seg in segs) == 120
    segs = build_segments(s, shared_prefix_loss="every")
    assert [seg.boundary_reason for seg in segs] == ["new_session", "branch"]
    assert sum(int(seg.loss_mask.sum()) for seg in segs) == 160


def test_retried_calls_are_labelled_retry():
    s = new_session()
    first = call(s, SYS, [30])
    again = call(s, SYS, [31])                       # the first call retried: a sibling root
    assert again.parent_id is None and again.boundary.reason == "retry"
    assert again.boundary.candidate_step == first.step_id
    call(s, ids(SYS, [31], TOOL), [40])
    call(s, ids(SYS, [31], TOOL), [41])              # a later call retried: a sibling step
    segs = build_segments(s)
    assert [seg.boundary_reason for seg in segs] == ["new_session", "retry", "retry"]
    assert [seg.step_ids for seg in segs] == [(0,), (1, 2), (3,)]
    assert sum(int(seg.loss_mask.sum()) for seg in segs) == 4
    # a retried first call with another tool schema is a schema change, not a retry
    t = new_session()
    call(t, SYS, [30], tools=[{"name": "a"}])
    assert t.route(SYS, tools=[{"name": "b"}]).boundary.reason == "tool_schema_change"
