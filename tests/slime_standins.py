"""slime's side of training, transcribed for tests that run without slime: the rollout's samples flattened,
the DP split of the train data, a rank's fetch of its part, and a training actor below the Megatron boundary.

A transcription of slime's RolloutManager._split_train_data_by_dp (slime/ray/rollout.py) and of
tensorize_rollout_data_for_training (slime/observability/rollout_data_utils.py), as far as they decide
which keys reach a training rank and in which form: only a fixed list of keys is copied per rank
(indexed by the rank's partition), ``raw_reward`` and ``total_lengths`` go whole, and the listed keys
become CPU tensors. The rank's data then crosses the Ray object store (pickled; imitated in-process).
:func:`dressage.integrations.slime_train.dressage_train_actor` wraps this module's
:func:`process_rollout_data`, as it wraps the one of the module slime's actor lives in.
"""

from __future__ import annotations

import itertools
import pickle
import threading

import torch

SLIME_SPLIT_KEYS = ("tokens", "multimodal_train_inputs", "response_lengths", "rewards", "truncated", "loss_masks",
                    "round_number", "sample_indices", "rollout_ids", "rollout_mask_sums", "rollout_log_probs",
                    "rollout_top_p_token_ids", "rollout_top_p_token_offsets", "rollout_routed_experts",
                    "source_names", "prompt", "teacher_log_probs")
SLIME_WHOLE_KEYS = ("raw_reward", "total_lengths")
SLIME_TENSOR_DTYPES = {"tokens": torch.long, "loss_masks": torch.int, "rollout_log_probs": torch.float32,
                       "rollout_top_p_token_ids": torch.int32, "rollout_top_p_token_offsets": torch.int32,
                       "teacher_log_probs": torch.float32, "rollout_routed_experts": None}


def flatten_like_slime(samples: list) -> list:
    """The rollout function's samples as slime's RolloutManager._get_rollout_data hands them to the
    conversion: lists of lists (groups, a session's Segments) flattened into one list."""
    while samples and isinstance(samples[0], list):
        samples = list(itertools.chain.from_iterable(samples))
    return samples


def split_like_slime(data: dict, partitions: list[list[int]]) -> list[bytes]:
    """Each rank's ``rollout_data`` as slime's split packs it for ``partitions`` (sample indices per
    rank; slime's schedule balances lengths), pickled as ``ray.put`` would."""
    data["total_lengths"] = [len(t) for t in data["tokens"]]
    out = []
    for partition in partitions:
        rank = {"partition": partition}
        rank.update({k: [data[k][j] for j in partition] for k in SLIME_SPLIT_KEYS if k in data})
        rank.update({k: data[k] for k in SLIME_WHOLE_KEYS if k in data})
        for key, dtype in SLIME_TENSOR_DTYPES.items():
            if key in rank:
                rank[key] = [torch.as_tensor(v, dtype=dtype) if dtype is not None else torch.as_tensor(v)
                             for v in rank[key]]
        if "rollout_mask_sums" in rank:
            rank["rollout_mask_sums"] = torch.as_tensor(rank["rollout_mask_sums"], dtype=torch.float32)
        out.append(pickle.dumps(rank, protocol=5))
    return out


def interleaved(n: int, dp_size: int) -> list[list[int]]:
    """Sample indices per rank, dealt round-robin."""
    return [list(range(r, n, dp_size)) for r in range(dp_size)]


def scheduled_like_slime(rollout_ids: list[int], global_batch_size: int, dp_size: int) -> list[list[int]]:
    """Sample indices per rank as slime's build_dp_schedule (slime/utils/dp_schedule.py) picks them,
    without its length balancing: the rollouts, in the order of their first sample, cut into steps of
    ``global_batch_size``; trailing rollouts that fill no step are dropped; a step's samples dealt
    round-robin."""
    by_rollout: dict[int, list[int]] = {}
    for i, rid in enumerate(rollout_ids):
        by_rollout.setdefault(rid, []).append(i)
    order = list(by_rollout)
    ranks: list[list[int]] = [[] for _ in range(dp_size)]
    for step in range(len(order) // global_batch_size):
        positions = [i for rid in order[step * global_batch_size:(step + 1) * global_batch_size]
                     for i in by_rollout[rid]]
        for k, i in enumerate(positions):
            ranks[k % dp_size].append(i)
    return ranks


def process_rollout_data(args, rollout_data_ref, dp_rank, dp_size):
    """slime.utils.data.process_rollout_data as far as the data goes: the rank's object from the store,
    ``total_lengths`` narrowed to its partition."""
    data = pickle.loads(rollout_data_ref[dp_rank])
    data["total_lengths"] = [data["total_lengths"][i] for i in data["partition"]]
    return data


SLIME_FETCH = process_rollout_data
"""slime's fetch as defined here, before any training actor wraps the module's name."""


def rank_data(box: bytes) -> dict:
    """What a rank's ``process_rollout_data`` gives for ``box`` (one rank's packed data), unwrapped."""
    return SLIME_FETCH(None, [box], 0, 1)


class MegatronActorStandIn:
    """slime's MegatronTrainRayActor below the Megatron boundary: ``_get_rollout_data`` fetches through
    its module's ``process_rollout_data`` and then moves the data on (here: keeps it); ``train`` takes
    the data and ends in the gradient all-reduce every DP rank joins (a barrier)."""

    def __init__(self, args, rank: int, size: int, all_reduce: threading.Barrier | None = None) -> None:
        self.args, self.rank, self.size, self.all_reduce = args, rank, size, all_reduce
        self.taken = None

    def _get_rollout_data(self, rollout_data_ref):
        return process_rollout_data(self.args, rollout_data_ref, self.rank, self.size)

    def train(self, rollout_id, rollout_data_ref, external_data=None):
        self.taken = self._get_rollout_data(rollout_data_ref)
        if self.all_reduce is not None:  # a single rank (a Ray actor of its own) has no peer to wait for
            self.all_reduce.wait(timeout=60)

    def taken_data(self):
        """What the last step trained on (a Ray actor's attributes are reached through its methods)."""
        return self.taken


def train_ranks(actor_cls, args, boxes):
    """Every rank's ``train`` at once, as slime's ``async_train`` runs them; the actors afterwards."""
    barrier = threading.Barrier(len(boxes))
    actors = [actor_cls(args, r, len(boxes), barrier) for r in range(len(boxes))]
    errors = []

    def run(actor):
        try:
            actor.train(0, boxes)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the test's thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(a,)) for a in actors]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return actors


def assert_same(a: dict, b: dict) -> None:
    """Two ranks' data are equal key by key, bit for bit: tensors by dtype, shape and value."""
    assert sorted(a) == sorted(b)
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), key
        elif x and isinstance(x, list) and isinstance(x[0], torch.Tensor):
            assert len(x) == len(y), key
            for u, v in zip(x, y):
                assert u.dtype == v.dtype and u.shape == v.shape and torch.equal(u, v), key
        else:
            assert x == y, key
