"""Discard and abort forget the session and its TransferQueue keys; a late call gets a clear 409."""

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
