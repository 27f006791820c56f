"""Field offload end to end: Proxy core -> TQ refs -> Segments -> DP shards -> restored slime fields.

Every step is recorded through ``ProxyCore.begin_step`` (``ingest`` waits for its future), the commit
region the Proxy's calls use, with the TQ write behind the answer unless a test turns it off."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dressage.errors import ConfigError, ExpertIdRangeError, SessionStateError, TransferQueueError
from dressage.fields import ModelSpec
from dressage.dataplane import DataPlaneConfig
from dressage.errors import TransferWriteError
from dressage.proxy.recording.core import ProxyCore
from dressage.rollout import RolloutManager
from dressage.rollout.manager import sample_ref_keys
from dressage.train import TrainingReader, release_batch, samples_digest
from trajgen import E, K, L, expected_r3, sglang_body

MODEL = ModelSpec(name="test-moe", num_layers=L, topk=K, num_experts=E, vocab_size=256)


def _config(tq_on, params=None, dtype="int32", view="lineage", drop=False):
    return DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=tq_on,
                           transfer_params=params if tq_on else None, routed_experts_dtype=dtype,
                           segment_view=view, drop_retry_orphans=drop)


def _drive(core, script, *, group=0):
    """Run one agent session: script = list of (parent choice, env tokens, response tokens)."""
    s = core.create_session({"group_index": group, "sample_index": 0})
    salt = 0
    for pick, kind, env, resp in script:
        salt += 1
        steps = list(s.steps.values())
        if not steps or kind == "rewrite":
            prompt = np.asarray([1, 2, 3 + pick % 5] + env, np.int32)
        elif kind == "retry":
            prompt = steps[pick % len(steps)].prompt_ids
        else:
            parent = steps[pick % len(steps)] if kind == "branch" else s.leaves()[pick % len(s.leaves())]
            prompt = np.concatenate([parent.full_ids, np.asarray(env, np.int32)])
        d = core.plan(s.session_id, prompt)
        body = sglang_body(prompt, resp, start=d.routed_experts_start, salt=salt)
        core.ingest(s.session_id, d, body, prompt_ids=prompt, version=salt % 3)
    core.finalize(s.session_id, reward=float(len(s.steps)))
    return s


def _pipeline(scripts, config, tq=None, dp=2):
    client = tq.client() if tq is not None and config.enable_transfer_queue else None
    rm = RolloutManager(dp_size=dp)
    core = ProxyCore(config, client, sink=rm, batch_tag=lambda: "rollout-0")
    for g, script in enumerate(scripts):
        _drive(core, script, group=g)
    core.close()  # every step is committed already; this stops the write-behind thread
    batch = rm.take_batch(0)
    keys = sample_ref_keys(batch.samples)
    rm_bytes = batch.resident_nbytes
    for shard in batch.shards:
        TrainingReader(client).restore(shard)
    if client is not None:
        release_batch(client, keys)
    return batch.samples, rm_bytes, client


step = st.tuples(st.integers(0, 50), st.sampled_from(["extend", "extend", "branch", "rewrite", "retry"]),
                 st.lists(st.integers(3, 25), max_size=3), st.lists(st.integers(30, 120), min_size=1, max_size=5))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(scripts=st.lists(st.lists(step, min_size=1, max_size=6), min_size=1, max_size=4),
       dtype=st.sampled_from(["uint8", "uint16", "int32"]), view=st.sampled_from(["lineage", "timeline"]),
       drop=st.booleans())
def test_tq_on_and_off_restore_identical_samples(tq, scripts, dtype, view, drop):
    off, _, _ = _pipeline(scripts, _config(False, dtype=dtype, view=view, drop=drop))
    digest = samples_digest(off)
    for params in (("logprobs",), ("routed_experts",), ("logprobs", "routed_experts")):
        on, _, client = _pipeline(scripts, _config(True, params, dtype=dtype, view=view, drop=drop), tq)
        assert len(on) == len(off)
        for a, b in zip(off, on):
            fa, fb = a.field_arrays(), b.field_arrays()
            assert fa.keys() == fb.keys()
            for name in fa:
                assert fa[name].dtype == fb[name].dtype and fa[name].shape == fb[name].shape, name
                np.testing.assert_array_equal(fa[name], fb[name])
            assert b.rollout_routed_experts.dtype == np.int32
            assert b.rollout_routed_experts.shape == (len(b.tokens) - 1, L, K)
            np.testing.assert_array_equal(b.rollout_routed_experts, expected_r3(b.tokens))
        assert samples_digest(on) == digest
        assert tq.total_keys() == 0          # consumed batches leave nothing behind
        client.close()


SCRIPT = [(0, "extend", [], [40, 41]), (0, "extend", [20, 21], [42, 43]), (0, "branch", [22], [44]),
          (0, "extend", [23], [45, 46])]


def test_no_tq_reads_before_training_and_rm_holds_only_refs(tq):
    client = tq.client()
    rm = RolloutManager(dp_size=2)
    core = ProxyCore(_config(True, dtype="uint8"), client, sink=rm)
    for g in range(3):
        _drive(core, SCRIPT, group=g)
    c = client.counters
    assert c.get_calls == 0 and c.rows_read == 0 and c.bytes_read == 0     # rollout + finalize read nothing
    assert c.bytes_written > 0 and tq.total_keys() == 2 * 4 * 3            # two fields per step, once each
    batch = rm.take_batch(0)
    assert all(not s.is_restored for s in batch.samples)
    assert all(s.rollout_routed_experts is None and s.rollout_log_probs is None for s in batch.samples)
    keys = sample_ref_keys(batch.samples)
    for shard in batch.shards:
        TrainingReader(client).restore(shard)
    assert client.counters.get_calls == 2
    assert release_batch(client, keys) == len(keys)
    assert tq.total_keys() == 0


def test_shared_step_is_stored_once_and_read_once_per_shard(tq):
    client = tq.client()
    rm = RolloutManager(dp_size=1)
    core = ProxyCore(_config(True), client, sink=rm)
    s = _drive(core, SCRIPT)
    batch = rm.take_batch(0)
    assert len(batch.samples) == 2                      # branch: two lineage Segments share steps 0..1
    shared = s.steps[0].routed_experts
    uses = [p.value for smp in batch.samples for p in smp.remote["routed_experts"] if p.value.key == shared.key]
    assert len(uses) == 2
    assert tq.total_keys() == 2 * len(s.steps)
    reader = TrainingReader(client)
    reader.restore(batch.shards[0])
    assert reader.last_plan.keys == 2 * len(s.steps)    # one read per key
    assert reader.last_plan.pieces > reader.last_plan.keys
    assert client.counters.refs_requested == 2 * len(s.steps)


@pytest.mark.parametrize("write_behind", [True, False])
def test_failed_local_commit_deletes_tq_keys(tq, monkeypatch, write_behind):
    client = tq.client()
    core = ProxyCore(_config(True), client, write_behind=write_behind)
    s = core.create_session()
    prompt = np.asarray([1, 2, 3], np.int32)
    d = core.plan(s.session_id, prompt)

    def boom(*a, **k):
        raise RuntimeError("injected commit failure")

    monkeypatch.setattr(s, "insert_step", boom)
    with pytest.raises(RuntimeError, match="injected"):
        core.ingest(s.session_id, d, sglang_body(prompt, [40, 41], start=0), prompt_ids=prompt)
    assert client.counters.bytes_written > 0
    assert tq.total_keys() == 0
    assert all(st_["keys"] == 0 for st_ in tq.stats().values())


@pytest.mark.parametrize("write_behind", [True, False])
def test_commit_after_finalize_meanwhile_deletes_keys(tq, write_behind):
    client = tq.client()
    core = ProxyCore(_config(True), client, write_behind=write_behind)
    s = core.create_session()
    prompt = np.asarray([1, 2, 3], np.int32)
    d = core.plan(s.session_id, prompt)
    core.ingest(s.session_id, d, sglang_body(prompt, [40], start=0), prompt_ids=prompt)
    p2 = np.concatenate([s.steps[0].full_ids, [7]]).astype(np.int32)
    d2 = core.plan(s.session_id, p2)
    # The session is finalized between the TQ write and the local commit.
    orig = s.insert_step

    def finalize_then_commit(*a, **k):
        s.finalize(1.0)
        return orig(*a, **k)

    s.insert_step = finalize_then_commit
    keys_before = tq.total_keys()
    with pytest.raises(SessionStateError):
        core.ingest(s.session_id, d2, sglang_body(p2, [41], start=d2.routed_experts_start), prompt_ids=p2)
    assert tq.total_keys() == keys_before


class _FailingClient:
    """Wraps a real client; the n-th write fails like a dead StorageUnit."""

    def __init__(self, inner, fail_on):
        self.inner, self.fail_on, self.n = inner, fail_on, 0

    def put_many(self, items, **kw):
        self.n += 1
        if self.n == self.fail_on:
            raise TransferQueueError("unit u0 did not answer")
        return self.inner.put_many(items, **kw)

    def delete(self, refs):
        return self.inner.delete(refs)


@pytest.mark.parametrize("write_behind", [True, False])
def test_tq_write_failure_leaves_session_unchanged(tq, write_behind):
    client = _FailingClient(tq.client(), fail_on=1)
    core = ProxyCore(_config(True), client, write_behind=write_behind)
    s = core.create_session()
    prompt = np.asarray([1, 2, 3], np.int32)
    d = core.plan(s.session_id, prompt)
    with pytest.raises(TransferWriteError, match="did not answer"):
        core.ingest(s.session_id, d, sglang_body(prompt, [40, 41], start=0), prompt_ids=prompt)
    assert len(s.steps) == 0 and s.state == "active"
    assert tq.total_keys() == 0
    # the session still works afterwards
    core.ingest(s.session_id, d, sglang_body(prompt, [40, 41], start=0), prompt_ids=prompt)
    assert len(s.steps) == 1


def test_out_of_range_expert_id_rejected_before_any_write(tq):
    client = tq.client()
    model = ModelSpec(name="big", num_layers=L, topk=K, num_experts=512)
    core = ProxyCore(DataPlaneConfig(model=model, use_rollout_routing_replay=True, enable_transfer_queue=True,
                                     routed_experts_dtype="uint16"), client)
    s = core.create_session()
    prompt = np.asarray([1, 2, 3], np.int32)
    rows = expected_r3(np.asarray([1, 2, 3, 40, 41]))
    rows[2, 1, 0] = 600
    d = core.plan(s.session_id, prompt)
    with pytest.raises(ExpertIdRangeError, match="600"):
        core.ingest(s.session_id, d, sglang_body(prompt, [40, 41], start=0, experts=rows), prompt_ids=prompt)
    assert client.counters.bytes_written == 0 and tq.total_keys() == 0 and len(s.steps) == 0
    with pytest.raises(ConfigError, match="uint8"):
        DataPlaneConfig(model=model, use_rollout_routing_replay=True, routed_experts_dtype="uint8")


def test_compact_dtype_works_with_tq_off_and_shrinks_proxy_r3():
    core = ProxyCore(_config(False, dtype="uint8"), None)
    s = _drive(core, SCRIPT)
    assert all(st_.routed_experts.dtype == np.uint8 for st_ in s.steps.values())


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int32"])
def test_routed_experts_dtype_is_one_choice_for_decode_and_commit(dtype):
    core = ProxyCore(_config(False, dtype=dtype), None)
    assert core.routed_experts_spec.storage_dtype == dtype
    s = core.create_session()
    prompt = np.asarray([1, 2, 3], np.int32)
    d = core.plan(s.session_id, prompt)
    out = core.normalize(sglang_body(prompt, [40, 41], start=0), prompt_len=3, decision=d)
    assert out.routed_experts.dtype == np.dtype(dtype)          # the engine's routing, decoded
    rows = expected_r3(np.asarray([1, 2, 3, 40, 41])).astype(np.int64)
    step = core.begin_step(s.session_id, d, prompt_ids=prompt, response_ids=[40, 41],
                           logprobs=out.logprobs, routed_experts=rows).result()
    assert step.routed_experts.dtype == np.dtype(dtype)         # a direct caller's routing, stored
    np.testing.assert_array_equal(step.routed_experts, out.routed_experts)


def test_flag_checks():
    with pytest.raises(ConfigError, match="--use-rollout-routing-replay"):
        DataPlaneConfig(model=MODEL, enable_transfer_queue=True, transfer_params=("routed_experts",))
    with pytest.raises(ConfigError, match="--enable-transfer-queue"):
        DataPlaneConfig(model=MODEL, transfer_params=("logprobs",))
    with pytest.raises(ConfigError, match="unknown field"):
        DataPlaneConfig(model=MODEL, enable_transfer_queue=True, transfer_params=("tokens",))
    assert DataPlaneConfig(model=MODEL, enable_transfer_queue=True).offloaded == ("logprobs",)
    assert _config(True).offloaded == ("logprobs", "routed_experts")
    assert _config(False).offloaded == ()


def test_abort_releases_keys(tq):
    client = tq.client()
    core = ProxyCore(_config(True), client)
    s = core.create_session()
    prompt = np.asarray([1, 2, 3], np.int32)
    core.ingest(s.session_id, core.plan(s.session_id, prompt), sglang_body(prompt, [40], start=0), prompt_ids=prompt)
    assert tq.total_keys() == 2
    assert core.abort(s.session_id) == 2
    assert tq.total_keys() == 0


def test_dropped_retry_orphans_release_their_keys(tq):
    client = tq.client()
    rm = RolloutManager()
    core = ProxyCore(_config(True, drop=True), client, sink=rm)
    script = [(0, "extend", [], [40]), (0, "extend", [20], [41]), (1, "retry", [], [42]), (0, "extend", [21], [43])]
    _drive(core, script)
    batch = rm.take_batch(0)
    assert len(batch.samples) == 1
    assert tq.total_keys() == len(sample_ref_keys(batch.samples)) == 2 * 3


def test_torch_tensors_share_memory_with_restored_arrays(tq):
    torch = pytest.importorskip("torch")
    from dressage.train import to_torch
    samples, _, _ = _pipeline([SCRIPT], _config(True), tq)
    t = to_torch(samples[0])
    assert t["rollout_routed_experts"].dtype == torch.int32
    assert t["rollout_routed_experts"].data_ptr() == samples[0].rollout_routed_experts.ctypes.data



@pytest.mark.parametrize("policy", ["fail", "drop", "reroll"])
def test_lost_keys_follow_the_on_lost_policy(tq, policy):
    from dressage.errors import LostSamplesError

    client = tq.client()
    rm = RolloutManager(dp_size=1)
    core = ProxyCore(_config(True), client, sink=rm)
    for g in range(3):
        _drive(core, SCRIPT, group=g)
    batch = rm.take_batch(0)
    victim = batch.samples[0]
    lost_key = victim.remote["routed_experts"][-1].value.key       # a key only this Sample's leaf uses
    client.delete([lost_key])                                      # as if its unit had lost it
    reader = TrainingReader(client, on_lost=policy)
    if policy == "fail":
        with pytest.raises(LostSamplesError) as info:
            reader.restore(batch.shards[0])
        assert f"{victim.session_id}#{victim.segment_index}" in info.value.samples
        assert info.value.keys == [lost_key]
        return
    kept = reader.restore(batch.shards[0])
    assert victim not in kept and len(kept) == len(batch.samples) - 1
    assert all(s.is_restored for s in kept)
    assert reader.last_lost.keys == [lost_key] and reader.last_lost.groups == [victim.group_index]


def test_rollout_manager_owns_token_fields_of_views():
    rm = RolloutManager()
    core = ProxyCore(_config(False), None, sink=rm)
    s = _drive(core, SCRIPT)
    for smp in rm.take_batch(0).samples:
        assert smp.tokens.base is None
    # a Segment whose tokens are a view (as after Ray deserialisation) gets its own copy
    from dressage.proxy.recording.core import FinalizedSession
    from dressage.trajectory import build_segments
    segs = build_segments(s)
    backing = np.concatenate([segs[0].tokens, segs[0].tokens])
    segs[0].tokens = backing[:len(segs[0].tokens)]
    (first, *_) = rm.add_finalized(FinalizedSession(s.session_id, segs, 1.0, {}))
    assert first.tokens.base is None and np.array_equal(first.tokens, segs[0].tokens)


def test_proxy_held_bytes_count_resident_large_fields_only(tq):
    off = ProxyCore(_config(False, dtype="uint8"), None)
    s_off = _drive(off, SCRIPT)
    held = off.held_bytes()
    assert held["steps"] == len(s_off.steps) == 4
    assert held["large_fields"] == sum(st.logprobs.nbytes + st.routed_experts.nbytes for st in s_off.steps.values())
    on = ProxyCore(_config(True, dtype="uint8"), tq.client())
    _drive(on, SCRIPT)
    assert on.held_bytes()["large_fields"] == 0
    assert on.held_bytes()["token_fields"] == held["token_fields"] > 0
