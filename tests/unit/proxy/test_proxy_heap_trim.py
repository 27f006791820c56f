"""Forgetting a batch of sessions hands the heap pages they freed back to the OS."""

from __future__ import annotations

import numpy as np

from dressage.proxy.upstream import trajectories as trajectories_mod



from dressage.proxy.recording import heap
def _service():
    from dressage.dataplane import DataPlaneConfig
    from dressage.fields import get_model
    from dressage.proxy.config import EnginesConfig, ProxyConfig
    from dressage.proxy.deployment import build_service
    from dressage.tokenizer import load_tokenizer

    cfg = ProxyConfig(data_plane=DataPlaneConfig(model=get_model("tiny-moe")),
                      engines=EnginesConfig(engine_url="http://127.0.0.1:9"))
    service, _ = build_service(cfg, tokenizer=load_tokenizer("byte"))
    return service


def test_trim_heap_reports_its_time():
    assert heap.trim_heap() >= 0.0


def test_forgetting_a_batch_trims_once_and_an_empty_forget_does_not(monkeypatch):
    calls = []
    monkeypatch.setattr(trajectories_mod, "trim_heap", lambda: calls.append(1) or 0.001)
    svc = _service()
    sids = []
    for _ in range(3):
        s = svc.core.create_session({})
        svc.core.sessions[s.session_id].add_step(np.arange(5, dtype=np.int32), np.arange(3, dtype=np.int32),
                                                     logprobs=np.zeros(3, np.float32))
        svc.trajectories.finalize(s.session_id, 1.0)
        sids.append(s.session_id)
    svc.trajectories.forget(sids)
    assert not svc.core.sessions and not svc.trajectories.finalized
    assert len(calls) == 1 and svc.stats()["heap_trims"] == 1 and svc.stats()["heap_trim_ms"] == 1.0
    svc.trajectories.forget([])
    assert len(calls) == 1
