"""Discard and abort forget the session and its TransferQueue keys; a late call gets a clear 409. A session
id used again writes keys of its own."""

import numpy as np
import pytest

from dressage.errors import SessionStateError, UnknownStepError
from dressage.fields import ModelSpec
from dressage.proxy.config import DataPlaneConfig
from dressage.proxy.recording.core import ProxyCore
from dressage.rollout import RolloutManager
from trajgen import E, K, L, sglang_body

MODEL = ModelSpec(name="test-moe", num_layers=L, topk=K, num_experts=E, vocab_size=256)


def _core(tq, sink=None):
    cfg = DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=True)
    return ProxyCore(cfg, tq.client(), sink=sink)


def _step(core, sid, resp=(40,)):
    prompt = np.asarray([1, 2, 3], np.int32)
    core.ingest(sid, core.plan(sid, prompt), sglang_body(prompt, list(resp), start=0), prompt_ids=prompt)


def test_discard_active_session_releases_keys_and_is_idempotent(tq):
    core = _core(tq)
    s = core.create_session()
    _step(core, s.session_id)
    assert tq.total_keys() == 2
    out = core.discard(s.session_id)
    assert out == {"session_id": s.session_id, "state": "discarded", "was": "active", "released_refs": 2, "samples": 0}
    assert tq.total_keys() == 0 and s.session_id not in core.sessions
    again = core.discard(s.session_id)
    assert again["released_refs"] == 0 and again["state"] == "discarded"
    with pytest.raises(SessionStateError, match="discarded"):
        _step(core, s.session_id)
    with pytest.raises(SessionStateError):
        core.create_session(session_id=s.session_id)
    with pytest.raises(UnknownStepError):
        core.discard("never-existed")


def test_discard_finalized_session_withdraws_its_samples(tq):
    rm = RolloutManager()
    core = _core(tq, sink=rm)
    keep, drop = core.create_session(), core.create_session()
    for s in (keep, drop):
        _step(core, s.session_id)
        core.finalize(s.session_id, reward=1.0)
    assert rm.num_ready == 2 and tq.total_keys() == 4
    out = core.discard(drop.session_id)
    assert out["was"] == "finalized" and out["samples"] == 1 and out["released_refs"] == 2
    assert rm.num_ready == 1 and tq.total_keys() == 2
    assert [s.session_id for s in rm.take_batch(0).samples] == [keep.session_id]


def test_aborted_sessions_leave_memory_but_stay_known(tq):
    core = _core(tq)
    s = core.create_session()
    _step(core, s.session_id)
    assert core.abort(s.session_id) == 2
    assert s.session_id not in core.sessions and core.state_of(s.session_id) == "aborted"
    with pytest.raises(SessionStateError, match="aborted"):
        core.session(s.session_id)
    core.gone_capacity = 1
    other = core.create_session()
    core.abort(other.session_id)
    assert core.state_of(s.session_id) is None and core.state_of(other.session_id) == "aborted"


def test_each_life_of_a_session_id_names_keys_of_its_own_also_across_a_restart(tq, tmp_path):
    from dressage.proxy.journal.log import Journal

    path = tmp_path / "j"
    cfg = DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=True)
    core = ProxyCore(cfg, tq.client(), journal=Journal(path, fsync="never"))
    keys = []
    for life in range(2):  # a drained id used again; the reader of the first life still holds its keys
        core.create_session(session_id="A")
        _step(core, "A")
        core.finalize("A", reward=float(life))
        keys.append({r.key for r in core.session("A").large_field_refs()})
        core.forget("A")
    core.create_session(session_id="A")
    _step(core, "A")  # a third life, active at the restart
    keys.append({r.key for r in core.session("A").large_field_refs()})
    core.close()
    fresh = ProxyCore(cfg, tq.client())
    fresh.recover(path)
    _step(fresh, "A", resp=(41,))  # the resumed session's call after the restart
    resumed = fresh.session("A").steps[1]
    keys.append({resumed.logprobs.key, resumed.routed_experts.key})
    assert [len(k) for k in keys] == [2, 2, 2, 2] and len(set().union(*keys)) == 8
    assert tq.total_keys() == 8
    assert all(k.startswith("A/") and k.endswith(("/logprobs", "/routed_experts")) for k in set().union(*keys))
    tq.client().delete(sorted(set().union(*keys)))
    assert tq.total_keys() == 0
