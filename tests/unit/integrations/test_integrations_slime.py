"""Restored Samples as slime Samples, checked against what slime's training conversion reads."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dressage.errors import FieldShapeError, TrajectoryError
from dressage.fields import VersionTable
from dressage.integrations.slime import (SLIME_TRAIN_FIELDS, SlimeSample, check_slime_sample, slime_sample_class,
                                         to_slime_groups, to_slime_sample)
from dressage.trajectory import Sample

L, K = 3, 2


def make(session="s0", group=0, index=0, prompt_len=3, response=4, version=7, segment=0, reward=1.0, **meta):
    t = prompt_len + response
    return Sample(tokens=np.arange(100, 100 + t, dtype=np.int32), response_length=response,
                  loss_mask=np.array([1, 1, 0, 1][:response] + [1] * max(0, response - 4), dtype=np.int32),
                  token_versions=np.full(response, version, dtype=np.int32),
                  rollout_log_probs=np.linspace(-1, -0.1, response).astype(np.float32),
                  rollout_routed_experts=(np.arange((t - 1) * L * K) % 8).reshape(t - 1, L, K).astype(np.int32),
                  reward=reward, session_id=session, group_index=group, index=index, segment_index=segment,
                  metadata=dict(meta))


def slime_train_data(samples, args):
    """What slime/ray/rollout.py's conversion does with each field (its documented contract)."""
    rollout_ids = [s.rollout_id for s in samples]
    used = {r for r in rollout_ids if r is not None}
    nxt = 0
    for i, r in enumerate(rollout_ids):
        if r is None:
            while nxt in used:
                nxt += 1
            rollout_ids[i] = nxt
            used.add(nxt)
    masks = []
    for s in samples:
        mask = s.loss_mask if s.loss_mask is not None else [1] * s.response_length
        assert len(mask) == s.response_length
        masks.append([0] * s.response_length if s.remove_sample else mask)
    return {"tokens": [s.tokens for s in samples], "response_lengths": [s.response_length for s in samples],
            "rewards": [s.get_reward_value(args) for s in samples],
            "truncated": [int(s.status == type(s).Status.TRUNCATED) for s in samples],
            "rollout_ids": rollout_ids, "loss_masks": masks,
            "rollout_log_probs": [s.rollout_log_probs for s in samples],
            "rollout_routed_experts": [np.asarray(s.rollout_routed_experts) for s in samples]}


def test_every_field_slime_reads_is_set_with_its_values():
    table = VersionTable()
    code = table.code("rl-step-4")
    s = make(version=code, finish_reason="length")
    out = to_slime_sample(s, rollout_id=5, versions=table, cls=SlimeSample, label="42", prompt="2+2?")
    for name in SLIME_TRAIN_FIELDS:
        assert hasattr(out, name)
    assert out.tokens == list(range(100, 107)) and out.response_length == 4
    assert out.loss_mask == [1, 1, 0, 1] and out.weight_versions == ["rl-step-4"]
    assert out.rollout_log_probs == pytest.approx(list(np.linspace(-1, -0.1, 4)))
    assert out.rollout_routed_experts.shape == (6, L, K) and out.rollout_routed_experts.dtype == np.int32
    assert out.status == SlimeSample.Status.TRUNCATED and out.rollout_id == 5 and out.label == "42"
    assert out.get_reward_value(SimpleNamespace(reward_key=None)) == 1.0
    assert out.metadata["finish_reason"] == "length" and out.metadata["segment_index"] == 0


def test_groups_share_rollout_ids_per_session_and_convert_like_slime():
    samples = [make("a", 0, 0, segment=0, sample_index=0), make("a", 0, 1, segment=1, sample_index=0),
               make("b", 0, 2, reward=0.0, sample_index=1), make("c", 1, 3, remove_sample=True, reward=0.5,
                                                               sample_index=0)]
    groups = to_slime_groups(samples[::-1], cls=SlimeSample, labels=["L0", "L1"], prompts=["p0", "p1"])
    assert [[s.session_id for s in g] for g in groups] == [["a", "a", "b"], ["c"]]
    assert [[s.rollout_id for s in g] for g in groups] == [[0, 0, 1], [2]]
    assert [g[0].label for g in groups] == ["L0", "L1"] and groups[1][0].prompt == "p1"
    data = slime_train_data([s for g in groups for s in g], SimpleNamespace(reward_key=None))
    assert data["rewards"] == [1.0, 1.0, 0.0, 0.5] and data["rollout_ids"] == [0, 0, 1, 2]
    assert data["loss_masks"][3] == [0, 0, 0, 0] and data["loss_masks"][0] == [1, 1, 0, 1]
    assert all(r.shape == (len(t) - 1, L, K) for r, t in zip(data["rollout_routed_experts"], data["tokens"]))


def test_dict_rewards_use_the_reward_key():
    out = to_slime_sample(make(reward=None), cls=SlimeSample)
    out.reward = {"acc": 1.0, "fmt": 0.0}
    assert out.get_reward_value(SimpleNamespace(reward_key="fmt")) == 0.0


def test_unrestored_samples_and_broken_shapes_are_refused():
    s = make()
    s.remote = {"routed_experts": ()}
    with pytest.raises(TrajectoryError, match="restore"):
        to_slime_sample(s, cls=SlimeSample)
    bad = to_slime_sample(make(), cls=SlimeSample)
    bad.rollout_routed_experts = np.zeros((7, L, K), dtype=np.int32)  # T rows, slime wants T-1
    with pytest.raises(FieldShapeError, match="expected \\[6"):
        check_slime_sample(bad)
    bad = to_slime_sample(make(), cls=SlimeSample)
    with pytest.raises(FieldShapeError):
        check_slime_sample(bad, num_layers=L + 1, topk=K)
    bad.loss_mask = [1]
    with pytest.raises(FieldShapeError, match="loss_mask"):
        check_slime_sample(bad)


def test_slime_class_is_used_when_importable():
    try:
        import slime.utils.types as real  # noqa: F401
    except ImportError:
        assert slime_sample_class() is SlimeSample
    else:
        assert slime_sample_class() is real.Sample
