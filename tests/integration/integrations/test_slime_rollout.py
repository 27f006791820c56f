"""slime's rollout-function signature driving agents through a real Proxy and built-in engine."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from dressage.errors import ConfigError, TrajectoryError
from dressage.fields import get_model
from dressage.harness.agents import make_prompts, run_rollout
from dressage.harness.agents.config import AgentConfig
from dressage.harness.slime_agent import SimulatedAgent
from dressage.integrations import slime_rollout
from dressage.integrations.slime import SlimeSample
from dressage.rollout import RolloutManager
from dressage.testing.stack import start_proxy

MODEL = get_model("tiny-moe")


class DataSource:
    """slime's data source contract: get_samples(n) -> n groups of Samples with prompt and label."""

    def __init__(self, prompts, per_group):
        self.prompts, self.per_group, self.calls = prompts, per_group, []

    def get_samples(self, n):
        self.calls.append(n)
        return [[SlimeSample(prompt=p, label=f"label-{g}", group_index=g) for _ in range(self.per_group)]
                for g, p in enumerate(self.prompts[:n])]


ENGINE = {"seed": 5, "mean_response_tokens": 12, "tool_call_rate": 0.0}


@pytest.fixture(scope="module")
def stack(engine):
    with start_proxy(engine.url, manager=RolloutManager()) as proxy:
        yield proxy.url, proxy.manager


def test_rollout_function_returns_slime_groups_with_restored_fields(stack):
    url, manager = stack
    rollout = slime_rollout.SlimeRollout(proxy_url=url, manager=manager, concurrency=4,
                                         agent=SimulatedAgent(AgentConfig(max_turns=2, tools=False, max_tokens=16)))
    slime_rollout.install(rollout)
    try:
        source = DataSource(["Add 2 and 3, then explain.",
                             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]],
                            per_group=2)
        out = slime_rollout.generate_rollout(SimpleNamespace(rollout_batch_size=2), 7, source)
    finally:
        slime_rollout.install(None)
    groups = out.samples if hasattr(out, "samples") else out
    assert source.calls == [2] and rollout.last_report.finalized == 4
    assert len(groups) == 2 and [g[0].label for g in groups] == ["label-0", "label-1"]
    sessions = {s.session_id for g in groups for s in g}
    assert len(sessions) == 4
    for g in groups:
        for s in g:
            assert len(s.loss_mask) == s.response_length == len(s.rollout_log_probs)
            r3 = np.asarray(s.rollout_routed_experts)
            assert r3.shape == (len(s.tokens) - 1, MODEL.num_layers, MODEL.topk)
            assert s.status.name in {"COMPLETED", "TRUNCATED"} and s.weight_versions
    # one rollout id per session, shared by its segments
    by_session = {}
    for s in (s for g in groups for s in g):
        by_session.setdefault(s.session_id, set()).add(s.rollout_id)
    assert all(len(ids) == 1 for ids in by_session.values())
    assert len({next(iter(ids)) for ids in by_session.values()}) == 4


def test_rollout_function_refuses_bad_inputs(stack):
    url, manager = stack
    rollout = slime_rollout.SlimeRollout(proxy_url=url, manager=manager, agent=SimulatedAgent(AgentConfig()))
    with pytest.raises(ConfigError, match="rollout_batch_size"):
        rollout(SimpleNamespace(rollout_batch_size=0), 0, DataSource(["x"], 1))
    with pytest.raises(ConfigError, match="prompt 0"):
        rollout(SimpleNamespace(rollout_batch_size=1), 0, DataSource([[{"role": "system", "content": "s"}]], 1))
    with pytest.raises(ConfigError, match="no Dressage rollout"):
        slime_rollout.generate_rollout(SimpleNamespace(rollout_batch_size=1), 0, DataSource(["x"], 1))


@pytest.mark.parametrize("with_tq", [False, True], ids=["tq-off", "tq-on"])
def test_rollout_function_drains_a_proxy_that_runs_as_its_own_service(engine, with_tq):
    """No sink: the rollout function reads its Samples over POST /trajectory/read, and with TQ on restores
    the large fields from the StorageUnits the Proxy names in its answers."""
    from dressage.tq import TransferQueue

    tq = TransferQueue.start({"deployment": "local", "num_storage_units": 1, "retention_s": None}) if with_tq else None
    proxy = start_proxy(engine.url, tq=tq, routed_experts_dtype="uint8")
    try:
        rollout = slime_rollout.SlimeRollout(proxy_url=proxy.url, concurrency=4, read_groups=1,
                                             agent=SimulatedAgent(AgentConfig(max_turns=2, tools=False, max_tokens=16)))
        out = rollout(SimpleNamespace(rollout_batch_size=2), 3, DataSource(["Add 2 and 3.", "Name a colour."], 2))
        groups = out.samples if hasattr(out, "samples") else out
        assert rollout.last_report.finalized == 4 and len(groups) == 2
        assert not proxy.service.trajectories.finalized  # drained: the Proxy handed them over
        for s in (s for g in groups for s in g):
            assert len(s.rollout_log_probs) == s.response_length
            r3 = np.asarray(s.rollout_routed_experts)
            assert r3.dtype == np.int32 and r3.shape == (len(s.tokens) - 1, MODEL.num_layers, MODEL.topk)
        if with_tq:  # the large fields came from the StorageUnit; its keys wait for the trainer's release
            assert tq.client().total_keys() > 0
        # A finalized session the agents did not run (another rollout's) is refused, not trained on.
        stray = asyncio.run(run_rollout(proxy.url, make_prompts(1, seed=9), 1,
                                        AgentConfig(max_turns=1, tools=False, max_tokens=8), concurrency=1))
        assert stray.finalized == 1
        with pytest.raises(TrajectoryError, match="read 5 finalized trajectories where the agents finalized 4"):
            rollout(SimpleNamespace(rollout_batch_size=2), 4, DataSource(["Add 2 and 3.", "Name a colour."], 2))
    finally:
        proxy.close()
        if tq is not None:
            tq.shutdown()
