"""Once a large Step is recorded and its session drained, the Proxy holds no more than it did before it:
every buffer of the call (the decoded body, the arrays handed to the TQ write thread) is gone."""

import gc
import tracemalloc

import numpy as np

from dressage.dataplane import DataPlaneConfig
from dressage.fields import ModelSpec
from dressage.proxy.recording.core import ProxyCore
from dressage.rollout import RolloutManager
from trajgen import E, K, L, sglang_body

MODEL = ModelSpec(name="test-moe", num_layers=L, topk=K, num_experts=E, vocab_size=256)
STEP_TOKENS = 1 << 20  # 1M tokens: ~24 MiB of int32 R3 and 4 MiB of logprobs per Step


def _tq_held(tq) -> int:
    return sum(u.usage()["memory_bytes"] for u in tq.storage_units().values())


def _step(core, session_id, prompt, tokens, salt):
    d = core.plan(session_id, prompt)
    resp = [(7 * i + salt) % 200 + 3 for i in range(tokens)]
    body = sglang_body(prompt, resp, start=d.routed_experts_start, salt=salt)
    core.ingest(session_id, d, body, prompt_ids=prompt, version=0)


def test_an_idle_proxy_returns_to_its_start_after_a_large_step(tq):
    config = DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=True,
                             routed_experts_dtype="int32")
    rm = RolloutManager(dp_size=1)
    core = ProxyCore(config, tq.client(), sink=rm, batch_tag=lambda: "rollout-0")
    try:
        prompt = np.asarray([1, 2, 3], np.int32)
        warm = core.create_session({"group_index": 0, "sample_index": 0})
        _step(core, warm.session_id, prompt, 64, salt=1)  # every lazy structure built once
        core.finalize(warm.session_id, reward=0.0)
        core.forget(warm.session_id)
        rm.take_batch(0)
        s = core.create_session({"group_index": 1, "sample_index": 0})
        gc.collect()
        tracemalloc.start()
        try:
            start, start_tq = tracemalloc.get_traced_memory()[0], _tq_held(tq)
            _step(core, s.session_id, prompt, STEP_TOKENS, salt=2)
            core.finalize(s.session_id, reward=1.0)  # drained: the Sample went to the trainer side ...
            core.forget(s.session_id)
            del s
            rm.take_batch(1)  # ... and was taken from there
            gc.collect()
            now, peak = tracemalloc.get_traced_memory()
            stored = _tq_held(tq) - start_tq
        finally:
            tracemalloc.stop()
        assert stored >= STEP_TOKENS * L * K * 4  # the Step's R3 is in the (in-process) unit ...
        # ... and besides what the unit stores, the idle Proxy holds what it held before, within 4 MiB.
        assert now - start - stored < 4 << 20, (now - start - stored, stored, peak - start)
    finally:
        core.close()
