"""``RolloutManager.take_batch(max_samples)`` cuts between whole sessions (and prompt groups), so releasing
one batch's TransferQueue keys never takes rows a later batch still has to restore."""

import numpy as np
import pytest

from dressage.dataplane import DataPlaneConfig
from dressage.errors import ConfigError
from dressage.fields import ModelSpec
from dressage.proxy.recording.core import ProxyCore
from dressage.rollout import RolloutManager
from dressage.rollout.manager import sample_ref_keys
from dressage.train import TrainingReader, release_batch

MODEL = ModelSpec(name="toy", num_layers=4, topk=2, num_experts=16)


def _core(tq, manager):
    cfg = DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=True,
                          routed_experts_dtype="uint8")
    return ProxyCore(cfg, tq.client(), sink=manager)


def _step(core, sid, prompt, response, expert):
    prompt = np.asarray(prompt, np.int32)
    d = core.plan(sid, prompt)
    rows = len(prompt) + len(response) - 1 - d.routed_experts_start
    core.begin_step(sid, d, prompt_ids=prompt, response_ids=response, logprobs=[-0.5] * len(response),
                    routed_experts=np.full((rows, 4, 2), expert, np.int32)).result()


def _branched_session(core, group, expert):
    """A root, a child and a branch from the root: two Segments that share the root's keys."""
    sid = core.create_session({"group_index": group}).session_id
    _step(core, sid, [1, 2, 3], [7, 8], expert)
    _step(core, sid, [1, 2, 3, 7, 8, 9], [10, 11], expert)
    _step(core, sid, [1, 2, 3, 7, 8, 5], [12, 13], expert)
    core.finalize(sid, reward=1.0)
    return sid


def _single_session(core, group, expert):
    sid = core.create_session({"group_index": group}).session_id
    _step(core, sid, [4, 5, 6], [9, 9], expert)
    core.finalize(sid, reward=0.0)
    return sid


def test_max_samples_takes_a_branched_session_whole_and_its_release_spares_the_next_batch(tq):
    client = tq.client()
    manager = RolloutManager(dp_size=1)
    core = _core(tq, manager)
    branched = _branched_session(core, 0, expert=3)
    other = _single_session(core, 1, expert=5)
    assert manager.num_ready == 3 and tq.total_keys() == 8  # 3 + 1 steps, logprobs and routed_experts each

    first = manager.take_batch(0, max_samples=1)  # the first session alone is 2 Samples: taken whole
    assert [s.session_id for s in first.samples] == [branched, branched]
    assert manager.num_ready == 1
    keys = sample_ref_keys(first.samples)
    assert len(keys) == 6  # root, child and branch, each Segment naming the root's two keys
    TrainingReader(client).restore(first.shards[0])
    assert release_batch(client, sorted(keys)) == 6
    assert tq.total_keys() == 2

    second = manager.take_batch(1)
    assert [s.session_id for s in second.samples] == [other]
    second_keys = sample_ref_keys(second.samples)
    assert len(second_keys) == 2 and not second_keys & keys
    TrainingReader(client).restore(second.shards[0])  # no LostSamplesError: nothing it needs was released
    sample = second.samples[0]
    assert sample.rollout_routed_experts.dtype == np.int32 and np.all(sample.rollout_routed_experts == 5)
    np.testing.assert_array_equal(sample.rollout_log_probs, np.array([-0.5, -0.5], np.float32))
    assert release_batch(client, sorted(second_keys)) == 2
    assert tq.total_keys() == 0


def test_max_samples_keeps_a_prompt_group_in_one_batch(tq):
    manager = RolloutManager(dp_size=2)
    core = _core(tq, manager)
    g0a = _single_session(core, 0, expert=1)
    g1 = _single_session(core, 1, expert=2)
    g0b = _single_session(core, 0, expert=3)  # group 0's second sample arrives after group 1's
    first = manager.take_batch(0, max_samples=2)
    assert sorted(s.session_id for s in first.samples) == sorted([g0a, g0b])
    assert [len(shard) for shard in first.shards] in ([2, 0], [0, 2])  # the group stays on one rank
    assert [s.session_id for s in manager.take_batch(1).samples] == [g1]


def test_max_samples_without_groups_cuts_between_sessions_in_arrival_order(tq):
    manager = RolloutManager(dp_size=1, keep_groups=False)
    core = _core(tq, manager)
    a = _single_session(core, 0, expert=1)
    b = _branched_session(core, 0, expert=2)
    c = _single_session(core, 0, expert=3)
    # a (1) fits, b (2) would make 3 > 2: the batch stops before it, even though c would fit.
    assert [s.session_id for s in manager.take_batch(0, max_samples=2).samples] == [a]
    assert sorted(s.session_id for s in manager.take_batch(1, max_samples=3).samples) == sorted([b, b, c])
    assert manager.num_ready == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_max_samples_must_be_a_positive_integer(bad):
    manager = RolloutManager()
    with pytest.raises(ConfigError, match="max_samples"):
        manager.take_batch(0, max_samples=bad)
