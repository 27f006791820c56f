"""Per-session reward normalisation against a transcription of slime's default arithmetic."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dressage.integrations.slime import SlimeSample
from dressage.integrations.slime_rewards import reward_post_process

torch = pytest.importorskip("torch")


def slime_default(args, samples):
    """slime/ray/rollout.py ``_post_process_rewards`` without a custom function, transcribed."""
    raw_rewards = [s.get_reward_value(args) for s in samples]
    if args.advantage_estimator in ["grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"] and \
            args.rewards_normalization:
        rewards = torch.tensor(raw_rewards, dtype=torch.float)
        if rewards.shape[-1] == args.n_samples_per_prompt * args.rollout_batch_size:
            rewards = rewards.reshape(-1, args.n_samples_per_prompt)
        else:
            rewards = rewards.view(-1, rewards.shape[-1])
        rewards = rewards - rewards.mean(dim=-1, keepdim=True)
        if args.advantage_estimator in ["grpo", "gspo", "cispo"] and args.grpo_std_normalization:
            rewards = rewards / (rewards.std(dim=-1, keepdim=True) + 1e-6)
        return raw_rewards, rewards.flatten().tolist()
    return raw_rewards, raw_rewards


def args_of(estimator="grpo", n=4, batch=2, norm=True, std=True, reward_key=None):
    return SimpleNamespace(advantage_estimator=estimator, rewards_normalization=norm, grpo_std_normalization=std,
                           n_samples_per_prompt=n, rollout_batch_size=batch, reward_key=reward_key)


def one_segment_batch(rewards, n):
    return [SlimeSample(group_index=i // n, index=i, rollout_id=i, reward=r) for i, r in enumerate(rewards)]


ESTIMATORS = ["grpo", "gspo", "cispo", "reinforce_plus_plus_baseline", "ppo"]


@settings(max_examples=60, deadline=None)
@given(estimator=st.sampled_from(ESTIMATORS), n=st.integers(2, 5), batch=st.integers(1, 4),
       norm=st.booleans(), std=st.booleans(), data=st.data())
def test_one_segment_sessions_in_complete_groups_match_slimes_default(estimator, n, batch, norm, std, data):
    rewards = data.draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0, 3.0]), min_size=n * batch,
                                 max_size=n * batch))
    args = args_of(estimator, n, batch, norm, std)
    samples = one_segment_batch(rewards, n)
    raw, out = reward_post_process(args, samples)
    want_raw, want = slime_default(args, samples)
    assert raw == want_raw
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(rewards=st.lists(st.floats(-2, 2, allow_nan=False, width=32), min_size=2, max_size=5),
       split=st.data())
def test_a_session_counts_once_however_many_segments_it_has(rewards, split):
    args = args_of(n=len(rewards), batch=1)
    plain = one_segment_batch(rewards, len(rewards))
    segments = split.draw(st.lists(st.integers(1, 3), min_size=len(rewards), max_size=len(rewards)))
    multi = [SlimeSample(group_index=0, index=i, rollout_id=i, reward=r)
             for i, (r, k) in enumerate(zip(rewards, segments)) for _ in range(k)]
    _, base = reward_post_process(args, plain)
    raw, out = reward_post_process(args, multi)
    assert len(out) == len(raw) == len(multi)
    expect = [base[s.rollout_id] for s in multi]
    np.testing.assert_allclose(out, expect, rtol=1e-6, atol=1e-7)


def test_a_two_segment_session_gets_the_advantage_of_a_one_segment_session_with_its_reward():
    args = args_of(n=3, batch=2)
    groups = [[(0, 1.0, 2), (1, 0.0, 1), (2, 0.0, 1)], [(3, 1.0, 1), (4, 0.0, 1), (5, 0.0, 3)]]
    samples = [SlimeSample(group_index=g, index=i, rollout_id=i, reward=r)
               for g, grp in enumerate(groups) for i, r, k in grp for _ in range(k)]
    _, out = reward_post_process(args, [samples])          # nested input is flattened as slime does
    by_session = {}
    for s, a in zip(samples, out):
        by_session.setdefault(s.rollout_id, set()).add(a)
    assert all(len(v) == 1 for v in by_session.values())
    adv = {k: v.pop() for k, v in by_session.items()}
    assert adv[0] == pytest.approx(adv[3]) and adv[0] > 0      # same reward in same-shaped groups: same advantage
    assert adv[1] == pytest.approx(adv[5]) and adv[1] < 0


def test_dict_rewards_use_the_reward_key_and_other_estimators_pass_raw_rewards_through():
    args = args_of(estimator="ppo", reward_key="acc")
    samples = [SlimeSample(group_index=0, index=0, rollout_id=0, reward={"acc": 0.5, "len": 3})]
    assert reward_post_process(args, samples) == ([0.5], [0.5])
