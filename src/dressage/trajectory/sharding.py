"""Data-parallel sharding of a batch of Samples, balanced by token count.

Longest-processing-time greedy: the heaviest unit goes to the lightest shard. With
``keep_groups`` a prompt group's samples (same ``group_index``) form one unit, as GRPO needs.
"""

from __future__ import annotations

import heapq
from typing import Callable, Sequence, TypeVar

from dressage.errors import ConfigError

__all__ = ["shard_samples", "shard_token_counts"]

T = TypeVar("T")


def _tokens(sample) -> int:
    return int(sample.total_length)


def shard_samples(samples: Sequence[T], dp_size: int, *, keep_groups: bool = False,
                  weight: Callable[[T], int] = _tokens) -> list[list[T]]:
    """Split ``samples`` into ``dp_size`` shards; each shard keeps the batch's order."""
    if not isinstance(dp_size, int) or isinstance(dp_size, bool) or dp_size <= 0:
        raise ConfigError(f"dp_size must be a positive integer, got {dp_size!r}")
    units: list[list[int]] = []
    if keep_groups:
        by_group: dict[object, list[int]] = {}
        for i, s in enumerate(samples):
            g = getattr(s, "group_index", None)
            by_group.setdefault(("g", g) if g is not None else ("i", i), []).append(i)
        units = list(by_group.values())
    else:
        units = [[i] for i in range(len(samples))]
    loads = [(weight(samples[u[0]]) if len(u) == 1 else sum(weight(samples[i]) for i in u), u) for u in units]
    # Heaviest first; ties by first index keep the result deterministic.
    loads.sort(key=lambda lu: (-lu[0], lu[1][0]))
    heap = [(0, rank) for rank in range(dp_size)]
    assigned: list[list[int]] = [[] for _ in range(dp_size)]
    for load, unit in loads:
        total, rank = heapq.heappop(heap)
        assigned[rank].extend(unit)
        heapq.heappush(heap, (total + load, rank))
    return [[samples[i] for i in sorted(idx)] for idx in assigned]


def shard_token_counts(shards: Sequence[Sequence[T]], weight: Callable[[T], int] = _tokens) -> list[int]:
    return [sum(weight(s) for s in shard) for shard in shards]
