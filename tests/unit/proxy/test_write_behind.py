"""Write-behind commit region: the answer does not wait for the TQ write; visibility still follows it."""

import asyncio
import threading

import numpy as np
import pytest

from dressage.dataplane import DataPlaneConfig
from dressage.errors import ExpertIdRangeError, FieldError, TransferQueueError, TransferWriteError
from dressage.fields import ModelSpec
from dressage.proxy.recording.core import ProxyCore
from trajgen import E, K, L, expected_r3, sglang_body

MODEL = ModelSpec(name="test-moe", num_layers=L, topk=K, num_experts=E, vocab_size=256)


class _Gated:
    """A real client whose writes wait for ``gate``; the calls numbered in ``fail`` fail like a dead unit."""

    def __init__(self, inner, fail=()):
        self.inner, self.fail, self.n = inner, set(fail), 0
        self.gate = threading.Event()
        self.gate.set()

    def put_many(self, items, **kw):
        self.gate.wait(10)
        self.n += 1
        if self.n in self.fail:
            raise TransferQueueError("unit u0 did not answer")
        return self.inner.put_many(items, **kw)

    def delete(self, refs):
        return self.inner.delete(refs)


def _core(client, dtype="uint8", **kw):
    cfg = DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=True,
                          routed_experts_dtype=dtype)
    return ProxyCore(cfg, client, **kw)


def _begin(core, sid, prompt, response, salt=1):
    prompt = np.asarray(prompt, np.int32)
    d = core.plan(sid, prompt)
    out = core.normalize(sglang_body(prompt, response, start=d.routed_experts_start, salt=salt),
                         prompt_len=len(prompt), decision=d)
    return core.begin_step(sid, d, prompt_ids=prompt, response_ids=out.output_ids, logprobs=out.logprobs,
                           routed_experts=out.routed_experts, token_versions=0)


def test_step_is_invisible_until_its_keys_are_committed(tq):
    client = _Gated(tq.client())
    core = _core(client)
    s = core.create_session()
    client.gate.clear()  # the write is on the wire and does not land yet
    pending = _begin(core, s.session_id, [1, 2, 3], [40, 41, 42])
    assert pending.preview.response_len == 3 and pending.preview.prompt_len == 3
    assert not pending.future.done()
    assert len(s.steps) == 0 and tq.total_keys() == 0
    client.gate.set()
    step = pending.result(10)
    assert len(s.steps) == 1 and s.steps[0] is step and tq.total_keys() == 2
    r3 = tq.client().get(step.routed_experts)
    assert r3.dtype == np.uint8
    np.testing.assert_array_equal(r3, expected_r3(np.asarray([1, 2, 3, 40, 41, 42])))


def test_failed_write_behind_records_nothing_and_the_session_goes_on(tq):
    client = _Gated(tq.client(), fail={1})
    core = _core(client)
    s = core.create_session()
    pending = _begin(core, s.session_id, [1, 2, 3], [40, 41])
    with pytest.raises(TransferWriteError, match="did not answer"):
        pending.result(10)
    assert len(s.steps) == 0 and s.state == "active" and tq.total_keys() == 0
    assert core.write_behind.failures == 1 and core.write_behind.pending() == 0
    # the next call routes against what was recorded (nothing): a new root, stored whole
    ok = _begin(core, s.session_id, [1, 2, 3], [40, 41]).result(10)
    assert ok.parent_id is None and len(s.steps) == 1 and tq.total_keys() == 2
    assert core.write_behind.failures == 1 and core.write_behind.committed == 1


def test_next_call_and_finalize_wait_for_the_write_under_way(tq):
    client = _Gated(tq.client())
    core = _core(client)
    s = core.create_session()
    client.gate.clear()
    first = _begin(core, s.session_id, [1, 2, 3], [40, 41])
    threading.Timer(0.2, client.gate.set).start()
    # plan() routes only once step 0 is in: the follow-up extends it instead of starting over
    second = _begin(core, s.session_id, np.concatenate([first.preview.full_ids, [7, 8]]), [50])
    assert first.future.done()
    assert second.result(10).parent_id == 0
    client.gate.clear()
    third = _begin(core, s.session_id, np.concatenate([s.steps[1].full_ids, [9]]), [60])
    threading.Timer(0.2, client.gate.set).start()
    done = core.finalize(s.session_id, reward=1.0)
    assert third.future.done() and len(s.steps) == 3
    assert [seg.step_ids for seg in done.segments] == [(0, 1, 2)]  # one lineage, all three steps
    np.testing.assert_array_equal(done.segments[0].tokens, s.steps[2].full_ids)


def test_each_call_is_validated_once_and_placed_where_the_session_stands_at_commit(tq, monkeypatch):
    client = _Gated(tq.client())
    core = _core(client)
    s = core.create_session()
    first = _begin(core, s.session_id, [1, 2, 3], [40, 41]).result(10)
    prepared = []
    real = s.prepare_step
    monkeypatch.setattr(s, "prepare_step", lambda *a, **kw: prepared.append(1) or real(*a, **kw))
    # Two concurrent calls of the session, both routed as an append to step 0 before either commits.
    p1, p2 = (np.concatenate([first.full_ids, tail]).astype(np.int32) for tail in ([7], [8, 9]))
    d1, d2 = core.plan(s.session_id, p1), core.plan(s.session_id, p2)
    assert (d1.kind, d1.parent_id) == (d2.kind, d2.parent_id) == ("append", 0)
    client.gate.clear()
    pending = []
    for prompt, d, resp in ((p1, d1, [50]), (p2, d2, [60, 61])):
        out = core.normalize(sglang_body(prompt, resp, start=d.routed_experts_start), prompt_len=len(prompt),
                             decision=d)
        pending.append(core.begin_step(s.session_id, d, prompt_ids=prompt, response_ids=out.output_ids,
                                       logprobs=out.logprobs, routed_experts=out.routed_experts,
                                       routed_experts_checked=True))
    assert prepared == [1, 1] and len(s.steps) == 1            # validated as each call ended, nothing in yet
    assert [p.preview.step_id for p in pending] == [1, 1]       # each as if it were the next step
    client.gate.set()
    a, b = (p.result(10) for p in pending)
    assert prepared == [1, 1]                                   # the commit validated nothing again
    assert (a.step_id, a.lineage_id, a.branch_from) == (1, 0, None)
    assert (b.step_id, b.lineage_id, b.branch_from) == (2, 1, 0)  # the second append became a branch
    assert s.steps[2] is b and s.children[0] == [1, 2]
    assert isinstance(pending[1].preview.routed_experts, np.ndarray) and pending[1].preview.step_id == 1
    assert not isinstance(b.routed_experts, np.ndarray)         # the committed step holds refs
    np.testing.assert_array_equal(tq.client().get(b.routed_experts), pending[1].preview.routed_experts)


def test_settled_awaits_without_blocking_the_loop(tq):
    client = _Gated(tq.client())
    core = _core(client)
    s = core.create_session()
    client.gate.clear()
    pending = _begin(core, s.session_id, [1, 2, 3], [40])

    async def main():
        ticks = 0

        async def tick():
            nonlocal ticks
            while not pending.future.done():
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        asyncio.get_running_loop().call_later(0.2, client.gate.set)
        await core.settled(s.session_id)
        await ticker
        return ticks

    assert asyncio.run(main()) > 3  # the loop kept running while the write was under way
    assert len(s.steps) == 1


def _bad_ids(rows):
    rows[1, 0, 1] = 300
    return rows


@pytest.mark.parametrize("bad, error, says", [
    (dict(routed_experts=_bad_ids), ExpertIdRangeError, "300"),
    (dict(logprobs=["a", "b"]), FieldError, "logprobs must be numbers"),
    (dict(logprobs=[0.5, object()]), FieldError, "logprobs must be numbers"),
    (dict(logprobs=[[0.1], [0.2, 0.3]]), FieldError, "logprobs must be numbers"),
], ids=["expert_id_out_of_range", "logprobs_strings", "logprobs_object", "logprobs_ragged"])
def test_bad_fields_fail_before_anything_is_queued(tq, bad, error, says):
    client = _Gated(tq.client())
    core = _core(client)
    s = core.create_session()
    prompt = np.asarray([1, 2, 3], np.int32)
    d = core.plan(s.session_id, prompt)
    rows = expected_r3(np.asarray([1, 2, 3, 40, 41])).astype(np.int32)
    fields = {"logprobs": np.zeros(2, np.float32), "routed_experts": rows}
    if "routed_experts" in bad:
        fields["routed_experts"] = bad["routed_experts"](rows)
    else:
        fields["logprobs"] = bad["logprobs"]
    with pytest.raises(error, match=says):
        core.begin_step(s.session_id, d, prompt_ids=prompt, response_ids=[40, 41], **fields)
    assert client.n == 0 and core.write_behind.batcher is None and len(s.steps) == 0


def test_close_lands_every_queued_step(tq):
    client = _Gated(tq.client())
    core = _core(client)
    sessions = [core.create_session() for _ in range(5)]
    client.gate.clear()
    pending = [_begin(core, s.session_id, [1, 2, 3 + i], [40 + i]) for i, s in enumerate(sessions)]
    threading.Timer(0.1, client.gate.set).start()
    core.close()
    assert all(p.future.done() and p.future.exception() is None for p in pending)
    assert all(len(s.steps) == 1 for s in sessions) and tq.total_keys() == 10
    assert client.n < 5  # queued steps went out together


def test_write_behind_off_commits_before_returning(tq):
    core = _core(tq.client(), write_behind=False)
    assert not core.writes_behind
    s = core.create_session()
    pending = _begin(core, s.session_id, [1, 2, 3], [40])
    assert pending.future.done() and len(s.steps) == 1 and core.write_behind.batcher is None


def test_routing_from_normalize_is_not_range_checked_twice(tq, monkeypatch):
    import dressage.proxy.recording.core as core_mod

    core = _core(tq.client())
    s = core.create_session()
    prompt = np.asarray([1, 2, 3], np.int32)
    d = core.plan(s.session_id, prompt)
    out = core.normalize(sglang_body(prompt, [40, 41], start=d.routed_experts_start), prompt_len=3, decision=d)
    checks = []
    real = core_mod.encode_routed_experts
    monkeypatch.setattr(core_mod, "encode_routed_experts", lambda *a, **kw: checks.append(1) or real(*a, **kw))
    step = dict(prompt_ids=prompt, response_ids=out.output_ids, logprobs=out.logprobs,
                routed_experts=out.routed_experts)
    core.begin_step(s.session_id, d, routed_experts_checked=True, **step).future.result(10)
    assert checks == []  # decoded (and checked) into uint8 once, by normalize
    d = core.plan(s.session_id, prompt)
    core.begin_step(s.session_id, d, **step).future.result(10)
    assert checks == [1]  # a direct caller's routing is checked


@pytest.mark.parametrize("dtype, bad", [(np.int32, 300), (np.uint8, E), (np.int64, -1)])
def test_checked_flag_keeps_the_guard_for_what_normalize_did_not_make(tq, dtype, bad):
    core = _core(tq.client())
    s = core.create_session()
    prompt = np.asarray([1, 2, 3], np.int32)
    d = core.plan(s.session_id, prompt)
    rows = expected_r3(np.asarray([1, 2, 3, 40, 41])).astype(dtype)
    rows[1, 0, 1] = bad
    step = dict(prompt_ids=prompt, response_ids=[40, 41], logprobs=np.zeros(2, np.float32), routed_experts=rows)
    flag = dtype != np.uint8  # a uint8 array is taken as checked only with the flag
    with pytest.raises(ExpertIdRangeError, match=str(bad)):
        core.begin_step(s.session_id, d, routed_experts_checked=flag, **step)
    assert len(s.steps) == 0
