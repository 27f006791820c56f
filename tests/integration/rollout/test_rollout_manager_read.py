"""A RolloutManager that drains a Proxy over ``POST /trajectory/read`` (the Proxy as its own service)
queues the same Samples as one the Proxy pushes each finalized session to, TQ off and on."""

from __future__ import annotations

import asyncio

import httpx
import msgpack
import pytest

from dressage.fields import get_model
from dressage.harness.agents import AgentConfig, make_prompts, run_rollout
from dressage.rollout import RolloutManager
from dressage.rollout.manager import sample_ref_keys
from dressage.train import TrainingReader, release_batch
from dressage.train.digest import samples_digest
from dressage.train.ray_actors import RolloutManagerActor
from dressage.trajectory.sample_wire import sample_from_wire

MODEL = get_model("tiny-moe")
N_PROMPTS, N_SAMPLES = 3, 2


def _restored(manager: RolloutManager, client) -> tuple[list, set[str]]:
    """The batch's Samples restored (not released) and the TQ keys they referenced."""
    return _restored_samples(manager.take_batch(0).samples, client)


def _restored_samples(samples: list, client) -> tuple[list, set[str]]:
    keys = sample_ref_keys(samples)
    TrainingReader(client).restore(samples)
    return samples, keys


@pytest.mark.parametrize("with_tq", [False, True], ids=["tq-off", "tq-on"])
def test_drained_samples_are_the_pushed_samples(engine, tq, proxy_stack, with_tq):
    proxy = proxy_stack(engine.url, tq=tq if with_tq else None, routed_experts_dtype="uint8", dp_size=2,
                        request_timeout_s=600)
    pushed = proxy.manager
    report = asyncio.run(run_rollout(proxy.url, make_prompts(N_PROMPTS, seed=2, max_background_words=0),
                                     N_SAMPLES, AgentConfig(max_turns=3, seed=5), concurrency=3))
    assert report.finalized == N_PROMPTS * N_SAMPLES
    # The same read as JSON (upstream's clients) and as msgpack (what read_proxy asks for) is one answer.
    as_json = httpx.post(proxy.url + "/trajectory/read", json={"format": "samples"}, timeout=30)
    as_msgpack = httpx.post(proxy.url + "/trajectory/read", json={"format": "samples"}, timeout=30,
                            headers={"accept": "application/msgpack"})
    assert as_json.headers["content-type"].startswith("application/json")
    assert as_msgpack.headers["content-type"] == "application/msgpack"
    from_json = [sample_from_wire(x) for t in as_json.json()["data"] for x in t["samples"]]
    from_msgpack = [sample_from_wire(x) for t in msgpack.unpackb(as_msgpack.content)["data"] for x in t["samples"]]
    assert len(from_json) == len(from_msgpack) > 0
    if not with_tq:
        assert len(as_msgpack.content) < 0.8 * len(as_json.content)  # raw bytes, not base64
    drained = RolloutManagerActor(dp_size=2)
    assert drained.read_proxy(proxy.url, max_groups=1) == N_PROMPTS * N_SAMPLES
    assert not proxy.service.trajectories.finalized  # handed over: the Proxy forgot them
    assert drained.read_proxy(proxy.url) == 0
    held = drained.held()
    if with_tq:  # only refs and token fields travelled; the large fields stayed in the StorageUnits
        assert held["large_fields"] == 0 and held["token_fields"] > 0
    else:
        assert held["large_fields"] > 0
    client = tq.client() if with_tq else None
    ours, our_keys = _restored(drained.rm, client)
    theirs, their_keys = _restored(pushed, client)
    restored_json, _ = _restored_samples(from_json, client)
    restored_msgpack, _ = _restored_samples(from_msgpack, client)
    assert samples_digest(restored_json) == samples_digest(restored_msgpack) == samples_digest(theirs)
    assert len(ours) == len(theirs) >= N_PROMPTS * N_SAMPLES
    assert drained.rm.sessions_received == pushed.sessions_received == N_PROMPTS * N_SAMPLES
    assert samples_digest(ours) == samples_digest(theirs)
    assert sorted(s.index for s in ours) == list(range(len(ours)))
    if with_tq:
        assert our_keys == their_keys and our_keys
        release_batch(client, sorted(our_keys))
        assert sum(int(row["keys"]) for row in tq.stats().values()) == 0
