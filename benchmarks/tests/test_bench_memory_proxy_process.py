"""The memory bench's Proxy process: a real Proxy outside Ray, driven over its pipes, drained over HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import os

import pytest

from dressage.harness.agents import AgentConfig, make_prompts, run_rollout
from dressage.fields import get_model
from dressage.train.ray_actors import RolloutManagerActor
from dressage_bench.memory.proxy_process import ProxyProcess

MODEL = get_model("tiny-moe")


@pytest.fixture(scope="module")
def engine():
    from dressage.testing.stack import start_engine

    srv = start_engine(model=MODEL, seed=3, tool_call_rate=0.0, mean_response_tokens=24)
    yield srv
    srv.stop()


def _mapped(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def test_the_proxy_process_serves_the_bench_and_loads_no_ray(engine):
    proxy = ProxyProcess({"model": dataclasses.asdict(MODEL), "dtype": "uint8", "engine_url": engine.url,
                          "tq_spec": None, "spread": True})
    try:
        pid = proxy.pid()
        assert pid != os.getpid() and proxy.url().startswith("http://127.0.0.1:")
        # Outside Ray: Ray's core library is not even mapped (a Ray worker maps _raylet.so).
        assert "_raylet" not in _mapped(pid) and "pyarrow" not in _mapped(pid)
        proxy.set_rollout(3)
        report = asyncio.run(run_rollout(proxy.url(), make_prompts(2, seed=1, max_background_words=0), 2,
                                         AgentConfig(max_turns=2, seed=4), concurrency=2))
        assert report.finalized == 4
        held = proxy.held()
        assert held["steps"] > 0 and held["large_fields"] > 0  # TQ off: the Proxy holds R3 and logprobs
        assert proxy.state_sizes()["finalized"] == 4
        rm = RolloutManagerActor(dp_size=1)
        assert rm.read_proxy(proxy.url()) == 4
        sizes = proxy.state_sizes()
        assert sizes["finalized"] == 0 and sizes["sessions"] == 0  # drained: the Proxy forgot them
        assert proxy.forget_finished() == 0
        # The recorded weight version is the rollout id the bench set.
        batch = rm.rm.take_batch(0)
        assert batch.samples and all(set(s.token_versions[s.loss_mask.astype(bool)]) == {3} for s in batch.samples)
    finally:
        proxy.stop()
    assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()


def test_a_failed_start_says_why(engine):
    with pytest.raises(RuntimeError, match="dtype"):
        ProxyProcess({"model": dataclasses.asdict(MODEL), "dtype": "float64", "engine_url": engine.url,
                      "tq_spec": None, "spread": True})
