"""slime's ``--custom-reward-post-process-path``: group-normalised rewards counted once per session.

slime's default normalises one reward per Sample over ``n_samples_per_prompt`` Samples a group; a
session that yields several Segments would count several times and shift its group's mean. Here
each session (the Samples sharing a ``rollout_id``) counts once in its group (``group_index``), with
slime's arithmetic, and its advantage is broadcast to every one of its Segments.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np

__all__ = ["reward_post_process", "NORMALIZED_ESTIMATORS", "STD_NORMALIZED_ESTIMATORS"]

NORMALIZED_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
"""Estimators whose rewards slime centres on the group mean (with ``--rewards-normalization``)."""
STD_NORMALIZED_ESTIMATORS = ("grpo", "gspo", "cispo")
"""Estimators whose centred rewards slime divides by the group's std + 1e-6 (``--grpo-std-normalization``)."""


def _flat(samples: Sequence[Any]) -> list[Any]:
    items = list(samples)
    while items and isinstance(items[0], list):
        items = list(itertools.chain.from_iterable(items))
    return items


def _raw(sample: Any, args: Any) -> float:
    get = getattr(sample, "get_reward_value", None)
    if callable(get):
        return get(args)
    key = getattr(args, "reward_key", None)
    return sample.reward[key] if key else sample.reward


def reward_post_process(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """``(raw_rewards, rewards)``, one entry per Sample, as slime's ``_post_process_rewards`` returns them.

    A session is the Samples sharing ``rollout_id`` (a Sample without one is a session of its own);
    its reward is its first Sample's. Sessions are grouped by ``group_index``; per group the session
    rewards are centred (``advantage_estimator`` in :data:`NORMALIZED_ESTIMATORS` with
    ``rewards_normalization``) and scaled by 1 / (std + 1e-6) (in :data:`STD_NORMALIZED_ESTIMATORS`
    with ``grpo_std_normalization``; std unbiased, as torch's), in float32 as slime computes them.
    """
    flat = _flat(samples)
    raw = [_raw(s, args) for s in flat]
    estimator = getattr(args, "advantage_estimator", None)
    if estimator not in NORMALIZED_ESTIMATORS or not getattr(args, "rewards_normalization", False):
        return raw, list(raw)
    session_of: list[Any] = []
    sessions: dict[Any, tuple[Any, float]] = {}   # session -> (group, reward), in order of first Sample
    for i, s in enumerate(flat):
        rid = getattr(s, "rollout_id", None)
        key = ("session", rid) if rid is not None else ("sample", i)
        session_of.append(key)
        sessions.setdefault(key, (getattr(s, "group_index", None), raw[i]))
    by_group: dict[Any, list[Any]] = {}
    for key, (group, _) in sessions.items():
        by_group.setdefault(group, []).append(key)
    scale = estimator in STD_NORMALIZED_ESTIMATORS and getattr(args, "grpo_std_normalization", False)
    advantage: dict[Any, float] = {}
    for keys in by_group.values():
        r = np.asarray([sessions[k][1] for k in keys], dtype=np.float32)
        r = r - r.mean(dtype=np.float32)
        if scale:
            with np.errstate(invalid="ignore", divide="ignore"):  # one session: nan, as torch's std gives
                std = r.std(ddof=1, dtype=np.float32) if len(r) > 1 else np.float32(np.nan)
            r = r / (std + np.float32(1e-6))
        advantage.update(zip(keys, (float(x) for x in r)))
    return raw, [advantage[k] for k in session_of]
