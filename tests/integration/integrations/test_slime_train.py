"""Refs past slime's DP sharding (``dressage_restore: trainer``): Samples read from a Proxy with TQ on keep
their refs, :func:`convert_samples_to_train_data` carries them through a transcription of slime's DP split,
and a stand-in training actor per rank restores exactly what the rollout-side restore would have given
slime, with one batched read per StorageUnit, and releases every key."""

from __future__ import annotations

import asyncio
import os
import pathlib
import pickle
import subprocess
import sys
import textwrap
import types
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import torch

import dressage
import dressage.integrations.slime_train as slime_train
from dressage.errors import (ConfigError, FieldShapeError, LostSamplesError, NoTransferQueueError, ProxyStatusError,
                             SampleWireError, StorageUnitUnavailable, TrajectoryError)
from dressage.fields.refs import FieldRef
from dressage.harness.agents import AgentConfig, make_prompts, run_rollout
from dressage.integrations.slime import REFS_METADATA_KEY, SlimeSample, to_slime_groups
from dressage.integrations.slime_train import (REFS_TRAIN_KEY, ProxyRolloutControl, RankRefs, carried_keys,
                                               convert_samples_to_train_data, dressage_train_actor,
                                               restore_rollout_data, tq_spec, unscheduled_samples)
from dressage.rollout.manager import sample_ref_keys
from dressage.tq import TransferQueue
from dressage.tq.client.spec import write_client_spec
from dressage.train import TrainingReader
from dressage.train.remote import ProxyTrajectorySource
from dressage.trajectory import Sample
from dressage.trajectory.pieces import Piece

import slime_standins
from slime_standins import (SLIME_FETCH, MegatronActorStandIn, assert_same, interleaved, rank_data,
                            scheduled_like_slime, split_like_slime, train_ranks)

ENGINE = {"seed": 11, "mean_response_tokens": 16, "tool_call_rate": 0.5}
N_PROMPTS, N_SAMPLES, DP = 3, 2, 2
ARGS = SimpleNamespace(advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
                       n_samples_per_prompt=N_SAMPLES, rollout_batch_size=N_PROMPTS, reward_key=None,
                       custom_reward_post_process_path=None)


def sharing_partitions(session_ids: list[str]) -> list[list[int]]:
    """Two ranks: the Segments of the first session that has several all on rank 0 (their shared keys
    are read once there), those of the second split over both ranks (keys two ranks share), the rest
    alternating."""
    by_session: dict[str, list[int]] = {}
    for i, sid in enumerate(session_ids):
        by_session.setdefault(sid, []).append(i)
    multi = [ix for ix in by_session.values() if len(ix) > 1]
    assert len(multi) >= 2, f"the rollout made too few multi-Segment sessions: {by_session}"
    ranks: list[list[int]] = [list(multi[0]), []]
    for k, i in enumerate(multi[1]):
        ranks[k % 2].append(i)
    placed = {i for r in ranks for i in r}
    for k, i in enumerate(i for i in range(len(session_ids)) if i not in placed):
        ranks[(k + 1) % 2].append(i)
    return [sorted(r) for r in ranks]


@pytest.fixture()
def tq2():
    q = TransferQueue.start({"deployment": "embedded", "num_storage_units": 2, "retention_s": None})
    yield q
    q.shutdown()


def test_each_rank_restores_its_refs_after_slimes_split_as_the_rollout_path_has_them(engine, tq2, proxy_stack):
    proxy = proxy_stack(engine.url, tq=tq2, routed_experts_dtype="uint8", request_timeout_s=600,
                        min_group_size=N_SAMPLES)
    report = asyncio.run(run_rollout(proxy.url, make_prompts(N_PROMPTS, seed=3, max_background_words=0), N_SAMPLES,
                                     AgentConfig(max_turns=3, seed=7, retry_rate=0.3), concurrency=3))
    assert report.finalized == N_PROMPTS * N_SAMPLES
    source = ProxyTrajectorySource(proxy.url)
    client = tq2.client()
    # The path without refs past the split: the rollout function restores, slime gets the fields.
    reference = source.read(drain=False).samples
    TrainingReader(client).restore(reference)
    reference_groups = to_slime_groups(reference, cls=SlimeSample)
    partitions = sharing_partitions([s.session_id for g in reference_groups for s in g])
    expected = split_like_slime(convert_samples_to_train_data(ARGS, reference_groups), partitions)
    # The trainer path: the Samples keep their refs through conversion and the split.
    batch = source.read(drain=True)
    keys = sample_ref_keys(batch.samples)
    assert keys and all(s.remote for s in batch.samples)
    groups = to_slime_groups(batch.samples, cls=SlimeSample, keep_refs=True)
    assert all(s.rollout_log_probs is None and s.rollout_routed_experts is None and REFS_METADATA_KEY in s.metadata
               for g in groups for s in g)
    assert [s.session_id for g in groups for s in g] == [s.session_id for g in reference_groups for s in g]
    boxes = split_like_slime(convert_samples_to_train_data(ARGS, groups), partitions)
    assert sum(len(b) for b in boxes) < sum(len(b) for b in expected)
    rank_keys = []
    for box in boxes:
        data = pickle.loads(box)
        assert REFS_TRAIN_KEY in data and "rollout_routed_experts" not in data and "rollout_log_probs" not in data
        rank_keys.append(set(carried_keys(data)))
    assert rank_keys[0] | rank_keys[1] == keys and rank_keys[0] & rank_keys[1]  # some keys on both ranks
    assert client.total_keys() == len(keys)
    # Each rank joins the Proxy's TransferQueue from the spec the read carried, as a Ray actor would, and
    # serves its restore metrics on a port of its own.
    args = SimpleNamespace(dressage_tq_spec=batch.transfer_queue, dressage_metrics_port=0,
                           dressage_metrics_host="127.0.0.1")
    actors = train_ranks(dressage_train_actor(MegatronActorStandIn), args, boxes)
    released: list[float] = []
    for actor, want, mine, box in zip(actors, expected, rank_keys, boxes):
        refs = actor._dressage_refs
        plan = refs.reader.last_plan
        read_bytes = sum((r.row_stop - r.row_start) * int(np.prod(r.shape[1:])) * np.dtype(r.dtype).itemsize
                         for r in plan.refs.values())
        scraped = _scrape(actor._dressage_metrics.url)
        assert scraped["dressage_tq_restore_bytes_total"] == read_bytes > 0
        assert scraped["dressage_tq_client_get_bytes_total"] == read_bytes  # what the rank's client moved
        assert scraped["dressage_tq_restore_seconds_count"] == 1 and scraped["dressage_tq_restore_seconds_sum"] > 0
        assert scraped["dressage_tq_restored_refs_total"] == len(mine)
        assert scraped["dressage_tq_restored_samples_total"] == len(pickle.loads(box)["tokens"])
        assert scraped["dressage_tq_lost_refs_total"] == 0
        released.append(scraped["dressage_tq_released_refs_total"])  # what the TQ still held when the rank released
        actor._dressage_metrics.close()
        units = {ref.unit_id for ref in plan.refs.values()}
        counters = refs.client.counters
        assert counters.get_calls == 1 and counters.get_requests == len(units) >= 1  # one round trip per unit
        assert plan.keys == len(mine) and refs.pending == []
        if actor.rank == 0:
            assert plan.pieces > plan.keys  # keys several Segments of a session share are read once
        assert_same(actor.taken, rank_data(want))  # bit for bit, dtypes and shapes included
        assert actor.taken["rollout_routed_experts"][0].dtype == torch.int32
        assert actor.taken["rollout_log_probs"][0].dtype == torch.float32
    # Each rank released after its step; keys two ranks share were read by both before either released
    # (and deleted by whichever released first).
    assert sum(released) == len(keys)
    assert client.total_keys() == 0 and sum(int(row["keys"]) for row in tq2.stats().values()) == 0
    # Outside an actor's ``_get_rollout_data`` the wrapped name answers what slime's function does.
    wrapped = slime_standins.process_rollout_data
    assert wrapped is not SLIME_FETCH and wrapped.__wrapped__ is SLIME_FETCH
    assert REFS_TRAIN_KEY in wrapped(None, boxes, 0, DP)
    dressage_train_actor(MegatronActorStandIn)
    assert slime_standins.process_rollout_data is wrapped  # wrapped once
    for actor in actors:
        actor._dressage_refs.client.close()


def _scrape(url: str) -> dict[str, float]:
    """Every sample of an exposition, by name (these metrics carry no labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(url, timeout=10)
    assert r.status_code == 200
    return {s.name: s.value for fam in text_string_to_metric_families(r.text) for s in fam.samples if not s.labels}


def test_a_lost_key_fails_the_rank_naming_its_samples_and_a_dropping_reader_is_refused(engine, tq2, proxy_stack):
    proxy = proxy_stack(engine.url, tq=tq2, routed_experts_dtype="uint8", request_timeout_s=600)
    asyncio.run(run_rollout(proxy.url, make_prompts(2, seed=4, max_background_words=0), 1,
                            AgentConfig(max_turns=2, seed=2), concurrency=2))
    batch = ProxyTrajectorySource(proxy.url).read(drain=True)
    data = convert_samples_to_train_data(ARGS, to_slime_groups(batch.samples, cls=SlimeSample, keep_refs=True))
    client = tq2.client()
    first = sorted(sample_ref_keys(batch.samples))[0]
    client.delete([first])  # lost before the trainer read it
    ranks = RankRefs(client)
    with pytest.raises(LostSamplesError, match="lost their large fields"):
        ranks.take(pickle.loads(split_like_slime(data, interleaved(len(batch.samples), 1))[0]))
    assert ranks.pending == [] and client.total_keys() == len(sample_ref_keys(batch.samples)) - 1
    with pytest.raises(ConfigError, match="on_lost"):
        restore_rollout_data(dict(data), TrainingReader(client, on_lost="drop"))
    client.delete(sorted(sample_ref_keys(batch.samples)))


def _synthetic(n: int, tokens: int, response: int, layers: int, topk: int, *, refs: bool) -> list[Sample]:
    """``n`` Samples of ``tokens`` tokens: large fields as FieldRefs (what TQ on carries) or resident."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        s = Sample(tokens=rng.integers(0, 150_000, tokens, dtype=np.int32), response_length=response,
                   loss_mask=np.ones(response, np.int8), token_versions=np.zeros(response, np.int32),
                   reward=float(i % 2), session_id=f"s{i}", group_index=i // 2, index=i, r3_trailing=(layers, topk))
        if refs:
            lp = FieldRef(f"k{i}/logprobs", f"unit{i % 2}", "logprobs", "float32", (response,))
            r3 = FieldRef(f"k{i}/routed_experts", f"unit{i % 2}", "routed_experts", "uint8",
                          (tokens - 1, layers, topk))
            s.remote.update(logprobs=(Piece(lp, 0, response),), routed_experts=(Piece(r3, 0, tokens - 1),))
        else:
            s.rollout_log_probs = -rng.random(response, dtype=np.float32)
            s.rollout_routed_experts = rng.integers(0, 128, (tokens - 1, layers, topk), dtype=np.int32)
        out.append(s)
    return out


def test_samples_slimes_schedule_drops_have_their_keys_released_at_conversion(engine, tq2, proxy_stack, caplog):
    # 6 rollouts (sessions) and a global batch of 4: slime trains one step of 4 rollouts and drops 2.
    proxy = proxy_stack(engine.url, tq=tq2, request_timeout_s=600)
    asyncio.run(run_rollout(proxy.url, make_prompts(N_PROMPTS, seed=5, max_background_words=0), N_SAMPLES,
                            AgentConfig(max_turns=3, seed=3), concurrency=3))
    batch = ProxyTrajectorySource(proxy.url).read(drain=True)
    keys = sample_ref_keys(batch.samples)
    client = tq2.client()
    assert client.total_keys() == len(keys) > 0
    args = SimpleNamespace(**vars(ARGS), global_batch_size=4, dressage_tq_spec=batch.transfer_queue)
    with caplog.at_level("WARNING", logger="dressage.integrations.slime_train"):
        data = convert_samples_to_train_data(args, to_slime_groups(batch.samples, cls=SlimeSample, keep_refs=True))
    partitions = scheduled_like_slime(data["rollout_ids"], 4, DP)
    kept = sorted(i for r in partitions for i in r)
    dropped = unscheduled_samples(data["rollout_ids"], 4)
    assert dropped and sorted(kept + dropped) == list(range(len(data["tokens"])))
    assert len(set(data["rollout_ids"][i] for i in dropped)) == 2
    kept_keys = set(carried_keys({REFS_TRAIN_KEY: [data[REFS_TRAIN_KEY][i] for i in kept]}))
    assert client.total_keys() == len(kept_keys) < len(keys)  # the dropped samples' keys are gone already
    assert "trains no rank on" in caplog.text
    train_ranks(dressage_train_actor(MegatronActorStandIn), args, split_like_slime(data, partitions))
    assert client.total_keys() == 0 and sum(int(row["keys"]) for row in tq2.stats().values()) == 0


def test_a_key_kept_and_dropped_samples_share_stays_for_the_rank_that_trains(monkeypatch):
    samples = _synthetic(5, 64, 16, 2, 2, refs=True)
    samples[4].remote = dict(samples[0].remote)  # a dropped sample that refers to a kept sample's keys
    samples[3].remote = {k: pieces for k, pieces in samples[3].remote.items() if k == "logprobs"} | {
        "routed_experts": samples[1].remote["routed_experts"]}
    released: list[list[str]] = []
    monkeypatch.setattr(slime_train, "_release_keys", lambda args, keys: released.append(list(keys)) or len(keys))
    groups = to_slime_groups(samples, cls=SlimeSample, keep_refs=True)
    args = SimpleNamespace(**vars(ARGS), global_batch_size=3)
    data = convert_samples_to_train_data(args, groups)
    assert data["rollout_ids"] == [0, 1, 2, 3, 4] and unscheduled_samples(data["rollout_ids"], 3) == [3, 4]
    assert released == [["k3/logprobs"]]  # k1's and k0's keys stay: samples 0 and 1 train
    released.clear()
    convert_samples_to_train_data(SimpleNamespace(**vars(ARGS), global_batch_size=5), groups)
    convert_samples_to_train_data(ARGS, groups)  # no global batch size given: slime's split is not ours to guess
    assert released == []
    def unreachable(args, keys):
        raise StorageUnitUnavailable("unit0 is unavailable")

    monkeypatch.setattr(slime_train, "_release_keys", unreachable)  # a clean-up that fails: the conversion stands
    assert convert_samples_to_train_data(args, groups)["rollout_ids"] == [0, 1, 2, 3, 4]
    # Rollouts count once however many samples each has, in the order of their first sample.
    assert unscheduled_samples([7, 7, 2, 9, 2, 9, 5], 3) == [6]
    assert unscheduled_samples([7, 7, 2, 9, 2, 9, 5], 2) == []
    assert unscheduled_samples([7, 7, 2], 3) == [0, 1, 2]


def test_refs_past_the_split_cut_what_crosses_the_object_store(capsys):
    # The seed's shape: 8 sessions of 4K tokens (1K response), R3 over 48 layers x top-8, two DP ranks.
    shape = dict(n=8, tokens=4096, response=1024, layers=48, topk=8)
    sizes = {}
    for mode in ("rollout", "trainer"):
        samples = _synthetic(**shape, refs=mode == "trainer")
        groups = to_slime_groups(samples, cls=SlimeSample, keep_refs=mode == "trainer")
        data = convert_samples_to_train_data(ARGS, groups)
        sizes[mode] = [len(b) for b in split_like_slime(data, interleaved(shape["n"], DP))]
    ratio = sum(sizes["trainer"]) / sum(sizes["rollout"])
    with capsys.disabled():
        print(f"\nper-rank rollout_data pickled (8 x 4K tokens, R3 48 x 8, DP {DP}): "
              f"restore in rollout {sizes['rollout']} B, refs only {sizes['trainer']} B, ratio {ratio:.4f}")
    assert sum(sizes["rollout"]) > 8 * 4095 * 48 * 8 * 4  # the int32 R3 rows alone
    assert ratio < 0.02  # what is left is the token fields and a few hundred bytes of refs per sample


def test_mixed_or_malformed_carriers_are_refused():
    refs = to_slime_groups(_synthetic(2, 64, 16, 2, 2, refs=True), cls=SlimeSample, keep_refs=True)[0]
    resident = to_slime_groups(_synthetic(2, 64, 16, 2, 2, refs=False), cls=SlimeSample)[0]
    with pytest.raises(TrajectoryError, match="rollout_log_probs"):
        convert_samples_to_train_data(ARGS, [refs[0], resident[1]])
    with pytest.raises(TrajectoryError, match="still references"):
        to_slime_groups(_synthetic(1, 64, 16, 2, 2, refs=True), cls=SlimeSample)
    data = convert_samples_to_train_data(ARGS, refs)
    bad = dict(data, prompt=[{"v": 99}, data["prompt"][1]])
    with pytest.raises(SampleWireError, match="carrier"):
        restore_rollout_data(bad, TrainingReader(None))
    short = dict(data, response_lengths=[data["response_lengths"][0]])
    with pytest.raises(FieldShapeError, match="carriers"):
        restore_rollout_data(short, TrainingReader(None))
    plain = convert_samples_to_train_data(ARGS, resident)
    assert REFS_TRAIN_KEY not in plain and restore_rollout_data(plain, TrainingReader(None)) == []


def test_rollout_control_pauses_and_resumes_the_proxy_around_a_weight_update(engine, proxy_stack):
    proxy = proxy_stack(engine.url)
    control = ProxyRolloutControl(proxy.url)
    state = lambda: httpx.get(proxy.url + "/v1/rollout/pause_state", timeout=10).json()  # noqa: E731
    seen = {}
    with control.paused(weight_version=3):
        seen["inside"] = state()
    after = state()
    assert seen["inside"]["paused"] is True and after["paused"] is False
    assert proxy.service.versions.current == 3
    with pytest.raises(RuntimeError):
        with control.paused(weight_version=4):
            raise RuntimeError("update failed")
    assert state()["paused"] is True and proxy.service.versions.current == 3  # a failed update stays paused
    control.resume()
    assert state()["paused"] is False


def _slime_samples(rewards, *, rollout_ids=None, remove=()):
    out = []
    for i, r in enumerate(rewards):
        s = SlimeSample(tokens=[1, 2, 3, 4], response_length=2, reward=r, loss_mask=[1, 0], index=i,
                        rollout_id=None if rollout_ids is None else rollout_ids[i], remove_sample=i in remove,
                        metadata={"source_name": "math"} if i == 0 else {})
        out.append(s)
    return out


def test_conversion_builds_slimes_train_data_and_normalises_rewards_per_group(monkeypatch):
    monkeypatch.setitem(sys.modules, "dressage.integrations.slime_rewards", None)  # not installed: slime's rule
    args = SimpleNamespace(**{**vars(ARGS), "n_samples_per_prompt": 2, "rollout_batch_size": 2})
    data = convert_samples_to_train_data(args, [_slime_samples([1.0, 0.0, 1.0, 1.0], rollout_ids=[0, None, 2, 0],
                                                               remove={3})])
    assert data["raw_reward"] == [1.0, 0.0, 1.0, 1.0]
    first = 0.5 / (float(np.std([0.5, -0.5], ddof=1)) + 1e-6)
    assert np.allclose(data["rewards"], [first, -first, 0.0, 0.0], atol=1e-6)
    assert data["rollout_ids"] == [0, 1, 2, 0]  # a missing id takes one no sample uses
    assert data["loss_masks"] == [[1, 0], [1, 0], [1, 0], [0, 0]] and data["rollout_mask_sums"] == [1, 1, 1, 1]
    assert data["source_names"] == ["math", "unknown", "unknown", "unknown"] and data["truncated"] == [0] * 4
    assert "rollout_log_probs" not in data and REFS_TRAIN_KEY not in data
    plain = convert_samples_to_train_data(SimpleNamespace(advantage_estimator="ppo"), _slime_samples([3.0, 1.0]))
    assert plain["rewards"] == plain["raw_reward"] == [3.0, 1.0]
    custom = types.ModuleType("custom_rewards_for_test")
    custom.post = lambda a, samples: ([s.reward for s in samples], [10.0 * s.reward for s in samples])
    monkeypatch.setitem(sys.modules, "custom_rewards_for_test", custom)
    by_path = SimpleNamespace(custom_reward_post_process_path="custom_rewards_for_test.post")
    via_path = convert_samples_to_train_data(by_path, _slime_samples([0.5, 1.0]))
    assert via_path["rewards"] == [5.0, 10.0]
    ours = types.ModuleType("dressage.integrations.slime_rewards")
    ours.reward_post_process = lambda a, samples: ([7.0] * len(samples), [0.25] * len(samples))
    monkeypatch.setitem(sys.modules, "dressage.integrations.slime_rewards", ours)
    assert convert_samples_to_train_data(args, _slime_samples([0.0, 1.0]))["rewards"] == [0.25, 0.25]
    # The user's own function, when named, wins over Dressage's, which is always installed.
    assert convert_samples_to_train_data(by_path, _slime_samples([0.5, 1.0]))["rewards"] == [5.0, 10.0]
    with pytest.raises(TrajectoryError, match="no samples"):
        convert_samples_to_train_data(args, [])


# ---------------------------------------------------------------- the training actor as Ray ships it
TESTS_DIR = pathlib.Path(slime_standins.__file__).parent
SRC_DIR = pathlib.Path(dressage.__file__).parent.parent


def _restored_and_ref_boxes(proxy, client, dp_size):
    """A rollout's data per rank, restored (what the rollout-side restore gives each rank) and with refs
    (what ``trainer`` puts through the object store), slime's DP split dealing samples round-robin."""
    asyncio.run(run_rollout(proxy.url, make_prompts(2, seed=4, max_background_words=0), N_SAMPLES,
                            AgentConfig(max_turns=3, seed=7, retry_rate=0.3), concurrency=2))
    source = ProxyTrajectorySource(proxy.url)
    reference = source.read(drain=False).samples
    TrainingReader(client).restore(reference)
    partitions = interleaved(len(reference), dp_size)
    expected = split_like_slime(convert_samples_to_train_data(ARGS, to_slime_groups(reference, cls=SlimeSample)),
                                partitions)
    batch = source.read(drain=True)
    data = convert_samples_to_train_data(ARGS, to_slime_groups(batch.samples, cls=SlimeSample, keep_refs=True))
    return batch, split_like_slime(data, partitions), expected


def _worker_env() -> dict[str, str]:
    """A fresh process that imports dressage and the stand-ins (slime's actor module), as a Ray worker would."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(SRC_DIR)])}


_FRESH_RANKS = textwrap.dedent("""
    import pickle, sys
    import slime_standins
    from slime_standins import SLIME_FETCH, train_ranks

    fresh = slime_standins.process_rollout_data is SLIME_FETCH
    with open(sys.argv[1], "rb") as f:
        cls, args, boxes = pickle.load(f)  # what a Ray worker does with the class it is sent
    actors = train_ranks(cls, args, boxes)
    out = {"fresh": fresh, "class_module": cls.__module__, "wrapped": slime_standins.process_rollout_data
           is not SLIME_FETCH and slime_standins.process_rollout_data.__wrapped__ is SLIME_FETCH,
           "taken": [a.taken for a in actors], "pending": [a._dressage_refs.pending for a in actors],
           "read": [a._dressage_refs.reader.last_plan.keys for a in actors]}
    for a in actors:
        a._dressage_refs.client.close()
    with open(sys.argv[2], "wb") as f:
        pickle.dump(out, f)
""")


def test_the_training_actor_pickles_and_restores_and_releases_in_the_process_it_is_sent_to(
        engine, tq2, proxy_stack, tmp_path):
    import ray.cloudpickle

    proxy = proxy_stack(engine.url, tq=tq2, routed_experts_dtype="uint8", request_timeout_s=600)
    client = tq2.client()
    batch, boxes, expected = _restored_and_ref_boxes(proxy, client, DP)
    keys = sample_ref_keys(batch.samples)
    assert client.total_keys() == len(keys) > 0
    cls = dressage_train_actor(MegatronActorStandIn)
    # Ray sends the class by value (it is made in a function); its methods reach no unpicklable global.
    (tmp_path / "actor.pkl").write_bytes(ray.cloudpickle.dumps(
        (cls, SimpleNamespace(dressage_tq_spec=batch.transfer_queue), boxes)))
    proc = subprocess.run([sys.executable, "-c", _FRESH_RANKS, str(tmp_path / "actor.pkl"), str(tmp_path / "out.pkl")],
                          capture_output=True, text=True, env=_worker_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = pickle.loads((tmp_path / "out.pkl").read_bytes())
    assert out["fresh"] and out["wrapped"]  # slime's fetch wrapped there, on the actor's first step
    assert out["class_module"] == "dressage.integrations.slime_train"
    assert out["pending"] == [[], []] and sum(out["read"]) >= len(keys)  # every key read, and released
    for taken, want in zip(out["taken"], expected):
        assert_same(taken, rank_data(want))  # restored bit for bit, dtypes and shapes included
        assert taken["rollout_routed_experts"][0].dtype == torch.int32 and REFS_TRAIN_KEY not in taken
    assert client.total_keys() == 0 and sum(int(row["keys"]) for row in tq2.stats().values()) == 0


@pytest.mark.ray
def test_the_training_actor_restores_and_releases_as_a_ray_actor(engine, tq2, proxy_stack):
    ray = pytest.importorskip("ray")

    proxy = proxy_stack(engine.url, tq=tq2, routed_experts_dtype="uint8", request_timeout_s=600)
    client = tq2.client()
    batch, boxes, expected = _restored_and_ref_boxes(proxy, client, 1)
    assert client.total_keys() == len(sample_ref_keys(batch.samples)) > 0
    # A fresh local cluster, never one another process on this host happens to run.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": _worker_env()["PYTHONPATH"]}})
    try:
        actor = ray.remote(dressage_train_actor(MegatronActorStandIn)).remote(
            SimpleNamespace(dressage_proxy_url=proxy.url), 0, 1)  # the rank asks the Proxy for its TQ
        ray.get(actor.train.remote(0, boxes), timeout=300)
        taken = ray.get(actor.taken_data.remote(), timeout=60)
    finally:
        ray.shutdown()
    assert_same(taken, rank_data(expected[0]))
    assert taken["rollout_routed_experts"][0].dtype == torch.int32 and REFS_TRAIN_KEY not in taken
    assert client.total_keys() == 0 and sum(int(row["keys"]) for row in tq2.stats().values()) == 0


def test_the_train_entry_marks_the_args_its_rollout_manager_gets(monkeypatch):
    """slime creates the RolloutManager with ``RolloutManager.options(...).remote(args, pg)``: Ray pickles
    the args into the actor, and the rollout function there is handed ``self.args``."""
    import argparse

    import ray.cloudpickle

    from dressage.integrations.slime_config import TRAIN_ENTRY_MARK, TRAINER_CONVERSION, check_trainer_handoff

    class Created(Exception):
        pass

    seen = {}

    def create_rollout_manager(args, pg):
        shipped = ray.cloudpickle.loads(ray.cloudpickle.dumps(args))
        check_trainer_handoff(shipped)  # what the rollout function does with them there
        seen["args"] = shipped
        raise Created

    stubs = {"slime.observability.logging_utils": dict(configure_logger=lambda: None, init_tracking=lambda a: None,
                                                       finish_tracking=lambda a: None),
             "slime.ray.placement_group": dict(create_placement_groups=lambda a: {"rollout": None},
                                               create_rollout_manager=create_rollout_manager,
                                               create_training_models=None),
             "slime.utils.misc": dict(should_run_periodic_action=None)}
    for name in ("slime", "slime.observability", "slime.ray", "slime.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    for name, attrs in stubs.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    args = argparse.Namespace(dressage_restore="trainer", custom_convert_samples_to_train_data_path=TRAINER_CONVERSION,
                              debug_rollout_only=False)
    with pytest.raises(ConfigError, match="in place of slime's train.py"):
        check_trainer_handoff(args)  # slime's train.py hands the RolloutManager these args as they are
    with pytest.raises(Created):
        slime_train.train(args)
    assert getattr(seen["args"], TRAIN_ENTRY_MARK) is True


def test_the_train_entry_says_slime_is_missing():
    proc = subprocess.run([sys.executable, "-m", "dressage.integrations.slime_train"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "slime is not importable" in proc.stderr


def test_a_rank_whose_samples_carry_a_field_unevenly_is_refused_and_left_as_it_came(tq):
    client = tq.client()
    samples = _synthetic(2, 16, 4, 2, 2, refs=False)
    for s in samples:  # the same fields, now in TQ: R3 for both, log-probs for the first only
        s.remote["routed_experts"] = (Piece(client.put("routed_experts", s.rollout_routed_experts.astype(np.uint8)),
                                            0, 15),)
        s.rollout_routed_experts = None
    samples[0].remote["logprobs"] = (Piece(client.put("logprobs", samples[0].rollout_log_probs), 0, 4),)
    samples[0].rollout_log_probs = None
    samples[1].rollout_log_probs = None  # lost on the way: neither resident nor carried
    data = convert_samples_to_train_data(ARGS, to_slime_groups(samples, cls=SlimeSample, keep_refs=True))
    before = sorted(data)
    with pytest.raises(TrajectoryError, match="rollout_log_probs: carried as refs for 1 of 2"):
        restore_rollout_data(data, TrainingReader(client))
    assert sorted(data) == before and REFS_TRAIN_KEY in data and "rollout_routed_experts" not in data
    samples[1].remote["logprobs"] = (Piece(client.put("logprobs", np.zeros(4, np.float32)), 0, 4),)
    data = convert_samples_to_train_data(ARGS, to_slime_groups(samples, cls=SlimeSample, keep_refs=True))
    keys = restore_rollout_data(data, TrainingReader(client))
    assert len(keys) == 4 and REFS_TRAIN_KEY not in data
    assert [a.shape for a in data["rollout_routed_experts"]] == [(15, 2, 2)] * 2
    assert data["rollout_routed_experts"][0].dtype == np.int32 and data["rollout_log_probs"][1].dtype == np.float32


def test_a_rank_finds_the_transfer_queue_by_asking_the_proxy_unless_given_a_spec(engine, tq, proxy_stack, tmp_path,
                                                                                 monkeypatch):
    for name in ("DRESSAGE_TQ_SPEC", "DRESSAGE_PROXY_URL", "DRESSAGE_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    proxy = proxy_stack(engine.url, tq=tq, admin_token="trainer-secret")
    spec = tq.client_spec()
    # The Proxy, by the YAML's dressage_proxy_url and the admin token the named variable holds.
    monkeypatch.setenv("MY_ADMIN_TOKEN", "trainer-secret")
    assert tq_spec(SimpleNamespace(dressage_proxy_url=proxy.url, dressage_admin_token_env="MY_ADMIN_TOKEN")) == spec
    with pytest.raises(ProxyStatusError) as info:  # the spec may carry the TQ's secret: no token, no spec
        tq_spec(SimpleNamespace(dressage_proxy_url=proxy.url))
    assert info.value.status_code == 401
    # ... or by the environment alone.
    monkeypatch.setenv("DRESSAGE_PROXY_URL", proxy.url)
    monkeypatch.setenv("DRESSAGE_ADMIN_TOKEN", "trainer-secret")
    assert tq_spec(SimpleNamespace()) == spec
    # Overrides: the spec itself, or a spec file, in args or DRESSAGE_TQ_SPEC; the Proxy is not asked.
    other = dict(spec, request_timeout_s=7.0)
    path = tmp_path / "tq.json"
    write_client_spec(other, path)
    assert tq_spec(SimpleNamespace(dressage_tq_spec=other)) == other
    assert tq_spec(SimpleNamespace(dressage_tq_spec=str(path))) == other
    monkeypatch.setenv("DRESSAGE_TQ_SPEC", str(path))
    assert tq_spec(SimpleNamespace(dressage_proxy_url=proxy.url)) == other
    with pytest.raises(ConfigError, match="dressage_tq_spec: expected"):
        tq_spec(SimpleNamespace(dressage_tq_spec=42))
    for name in ("DRESSAGE_TQ_SPEC", "DRESSAGE_PROXY_URL"):
        monkeypatch.delenv(name)
    with pytest.raises(ConfigError, match="set dressage_proxy_url"):
        tq_spec(SimpleNamespace())
    with pytest.raises(ConfigError, match="dressage_admin_token_env: the environment variable NOT_SET_HERE"):
        tq_spec(SimpleNamespace(dressage_proxy_url=proxy.url, dressage_admin_token_env="NOT_SET_HERE"))


def test_a_rank_of_a_proxy_without_transfer_queue_is_told_so(engine, proxy_stack):
    proxy = proxy_stack(engine.url)
    with pytest.raises(NoTransferQueueError, match="--enable-transfer-queue"):
        tq_spec(SimpleNamespace(dressage_proxy_url=proxy.url))
