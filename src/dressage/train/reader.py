"""TrainingReader: dedup a shard's refs, batch-read them once, restore slime's fields.

``rollout_log_probs`` comes back float32 over the response (0.0 on environment tokens) and
``rollout_routed_experts`` int32 ``[T-1, num_layers, topk]``, the same as the path without TQ.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from dressage.trajectory import SAMPLE_LARGE_FIELDS, Sample, materialize_pieces
from dressage.trajectory.pieces import Piece

__all__ = ["TrainingReader", "ReadPlan", "release_batch", "to_torch"]


@dataclass(slots=True)
class ReadPlan:
    """Per key, the smallest row range covering every piece of the shard that uses it."""

    refs: dict[str, Any]            # key -> ref narrowed to the union range
    offsets: dict[str, int]         # key -> absolute row where the read starts
    pieces: int                     # pieces referring to TQ before dedup

    @property
    def keys(self) -> int:
        return len(self.refs)


def plan_reads(samples: Sequence[Sample]) -> ReadPlan:
    spans: dict[str, tuple[Any, int, int]] = {}
    n = 0
    for s in samples:
        for pieces in s.remote.values():
            for p in pieces:
                if not isinstance(p, Piece) or isinstance(p.value, np.ndarray):
                    continue
                n += 1
                ref = p.value
                lo, hi = ref.row_start + p.start, ref.row_start + p.stop
                if ref.key in spans:
                    base, a, b = spans[ref.key]
                    spans[ref.key] = (base, min(a, lo), max(b, hi))
                else:
                    spans[ref.key] = (ref, lo, hi)
    refs, offsets = {}, {}
    for key, (ref, lo, hi) in spans.items():
        refs[key], offsets[key] = dataclasses.replace(ref, row_start=lo, row_stop=hi), lo
    return ReadPlan(refs, offsets, n)


class TrainingReader:
    """Restores a DP shard's Samples in place with one batched read per StorageUnit."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.last_plan: ReadPlan | None = None

    def restore(self, samples: Sequence[Sample]) -> list[Sample]:
        samples = list(samples)
        plan = plan_reads(samples)
        self.last_plan = plan
        keys = list(plan.refs)
        arrays = dict(zip(keys, self.client.get_many([plan.refs[k] for k in keys]))) if keys else {}

        def resolve(p: Piece) -> np.ndarray:
            if isinstance(p.value, np.ndarray):
                return p.value[p.start:p.stop]
            ref = p.value
            base = ref.row_start - plan.offsets[ref.key]
            return arrays[ref.key][base + p.start: base + p.stop]

        for s in samples:
            for name, pieces in list(s.remote.items()):
                setattr(s, SAMPLE_LARGE_FIELDS[name], materialize_pieces(name, pieces, s.r3_trailing, resolve))
                del s.remote[name]
        return samples

    async def arestore(self, samples: Sequence[Sample]) -> list[Sample]:
        import asyncio
        return await asyncio.to_thread(self.restore, samples)


def release_batch(client: Any, keys: Sequence[str]) -> int:
    """Delete a consumed batch's keys from every StorageUnit (call once, after all ranks trained)."""
    return int(client.delete(list(keys))) if keys else 0


def to_torch(sample: Sample) -> dict[str, Any]:
    """The Sample's arrays as torch tensors sharing memory with them (``torch.from_numpy``)."""
    import torch

    return {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in sample.field_arrays().items()}
