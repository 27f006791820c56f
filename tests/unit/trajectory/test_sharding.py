"""Data-parallel sharding balance and group locality."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.errors import ConfigError
from dressage.trajectory import Sample, shard_samples, shard_token_counts


def _sample(n_tokens, group=None, index=0):
    return Sample(tokens=np.zeros(n_tokens, np.int32), response_length=1, loss_mask=np.ones(1, np.int8),
                  token_versions=np.zeros(1, np.int32), group_index=group, index=index)


def test_shards_are_balanced_by_tokens():
    sizes = [100, 90, 80, 70, 60, 50, 40, 30, 20, 10]
    shards = shard_samples([_sample(n, index=i) for i, n in enumerate(sizes)], 2)
    loads = shard_token_counts(shards)
    assert sum(loads) == 550 and max(loads) - min(loads) <= 10
    assert [s.index for s in shards[0]] == sorted(s.index for s in shards[0])   # order kept


def test_groups_stay_on_one_shard():
    samples = [_sample(10 + i, group=i // 4, index=i) for i in range(16)]
    shards = shard_samples(samples, 3, keep_groups=True)
    for shard in shards:
        groups = {s.group_index for s in shard}
        for g in groups:
            assert sum(1 for s in shard if s.group_index == g) == 4


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=64), st.integers(1, 8))
def test_lpt_balance_bound_and_nothing_lost(sizes, dp):
    samples = [_sample(n, index=i) for i, n in enumerate(sizes)]
    shards = shard_samples(samples, dp)
    assert len(shards) == dp
    assert sorted(s.index for sh in shards for s in sh) == list(range(len(sizes)))
    loads = shard_token_counts(shards)
    # Greedy LPT: the heaviest shard exceeds the mean by at most one sample's size.
    assert max(loads) <= sum(sizes) / dp + max(sizes)


def test_bad_dp_size():
    with pytest.raises(ConfigError, match="dp_size"):
        shard_samples([], 0)
