"""TrainingReader: dedup a shard's refs, batch-read them once, restore slime's fields.

``rollout_log_probs`` comes back float32 over the response (0.0 on environment tokens) and
``rollout_routed_experts`` int32 ``[T-1, num_layers, topk]``, the same as the path without TQ.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from dressage.errors import ConfigError, KeyNotFoundError, LostSamplesError, StorageUnitUnavailable
from dressage.trajectory import SAMPLE_LARGE_FIELDS, Sample, materialize_pieces
from dressage.trajectory.pieces import Piece

__all__ = ["TrainingReader", "ReadPlan", "LostReport", "LOST_POLICIES", "release_batch", "releasing", "count_keys_left",
           "to_torch"]

log = logging.getLogger(__name__)


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


LOST_POLICIES = ("fail", "drop", "reroll")


@dataclass(slots=True)
class LostReport:
    """Samples of a shard whose large fields could not be read, and why."""

    samples: list[Sample]
    keys: list[str]
    reasons: list[str]

    @property
    def groups(self) -> list[int]:
        """Prompt groups to re-roll (``on_lost='reroll'``)."""
        return sorted({s.group_index for s in self.samples if s.group_index is not None})


class TrainingReader:
    """Restores a DP shard's Samples in place with one batched read per StorageUnit.

    ``on_lost`` says what happens to Samples whose StorageUnit died or no longer has their
    keys: ``fail`` raises :class:`LostSamplesError` naming them; ``drop`` and ``reroll`` leave
    them out of the returned list and describe them in ``last_lost`` (``reroll`` is a request
    to the driver to roll their prompts again). ``metrics`` (a :class:`~dressage.train.metrics.RestoreMetrics`)
    counts each restore's bytes, keys and time.
    """

    def __init__(self, client: Any, *, on_lost: str = "fail", metrics: Any = None) -> None:
        if on_lost not in LOST_POLICIES:
            raise ConfigError(f"on_lost: expected one of {', '.join(LOST_POLICIES)}, got {on_lost!r}")
        self.client = client
        self.on_lost = on_lost
        self.metrics = metrics
        self.last_plan: ReadPlan | None = None
        self.last_lost: LostReport | None = None

    def _read(self, plan: ReadPlan) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        keys = list(plan.refs)
        if not keys:
            return {}, {}
        try:
            return dict(zip(keys, self.client.get_many([plan.refs[k] for k in keys]))), {}
        except (StorageUnitUnavailable, KeyNotFoundError):
            pass
        # Something is lost: read unit by unit to learn exactly which keys.
        arrays: dict[str, np.ndarray] = {}
        lost: dict[str, str] = {}
        by_unit: dict[str, list[str]] = {}
        for k in keys:
            by_unit.setdefault(plan.refs[k].unit_id, []).append(k)
        for unit, unit_keys in by_unit.items():
            try:
                arrays.update(zip(unit_keys, self.client.get_many([plan.refs[k] for k in unit_keys])))
            except StorageUnitUnavailable as exc:
                lost.update((k, f"unit {unit}: {exc}") for k in unit_keys)
            except KeyNotFoundError:
                for k in unit_keys:  # one key at a time, to keep what is still there
                    try:
                        arrays[k] = self.client.get_many([plan.refs[k]])[0]
                    except (StorageUnitUnavailable, KeyNotFoundError) as exc:
                        lost[k] = str(exc)
        return arrays, lost  # empty ``lost``: the failure was transient and every unit answered

    def restore(self, samples: Sequence[Sample]) -> list[Sample]:
        """Restore ``samples`` in place; returns those restored (all of them unless some were lost)."""
        samples = list(samples)
        plan = plan_reads(samples)
        self.last_plan, self.last_lost = plan, None
        start = time.perf_counter()
        arrays, lost = self._read(plan)
        if self.metrics is not None and plan.keys:
            self.metrics.observe_restore(
                seconds=time.perf_counter() - start, nbytes=sum(int(a.nbytes) for a in arrays.values()),
                refs=len(arrays), samples=sum(1 for s in samples if s.remote and not (_sample_keys(s) & lost.keys())),
                lost=len(lost))
        if lost:
            hit = [s for s in samples if _sample_keys(s) & lost.keys()]
            names = [f"{s.session_id}#{s.segment_index}" for s in hit]
            if self.on_lost == "fail":
                raise LostSamplesError(
                    f"{len(hit)} Samples lost their large fields ({len(lost)} keys; e.g. "
                    f"{next(iter(lost.values()))}): {', '.join(names[:10])}", samples=names, keys=sorted(lost))
            self.last_lost = LostReport(hit, sorted(lost), sorted(set(lost.values())))
            samples = [s for s in samples if not (_sample_keys(s) & lost.keys())]

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


def _sample_keys(s: Sample) -> set[str]:
    return {p.value.key for pieces in s.remote.values() for p in pieces
            if isinstance(p, Piece) and not isinstance(p.value, np.ndarray)}


def release_batch(client: Any, keys: Sequence[str], *, metrics: Any = None) -> int:
    """Delete a consumed batch's keys from every StorageUnit (call once, after all ranks trained); returns
    how many the TransferQueue knew, which ``metrics`` (a ``RestoreMetrics``) counts as released."""
    # Passed as given: the client refuses one key string (iterated, it would name each of its characters).
    released = int(client.delete(keys)) if keys else 0
    if metrics is not None:
        metrics.observe_release(released)
    return released


def count_keys_left(tq: Any) -> tuple[int | None, str]:
    """The keys ``tq`` (a TransferQueue or its client) holds (0 for None), or None and why when a StorageUnit
    cannot be asked: a unit that is dead or does not answer ends no run or read early; its report says the
    count is unknown, and its verdict fails on that."""
    if tq is None:
        return 0, ""
    try:
        return tq.total_keys(), ""
    except StorageUnitUnavailable as exc:
        return None, str(exc)


@contextlib.contextmanager
def releasing(client: Any, keys: Sequence[str], *, metrics: Any = None) -> Iterator[None]:
    """Run the block, then :func:`release_batch` ``keys`` (nothing when ``client`` is None), also when the
    block raised: a batch that left the RolloutManager has nobody else to release it. A release that fails
    after the block raised is logged and the block's error goes on (a ``LostSamplesError`` names the lost
    Samples; the release's error would name only a unit); after a block that finished it is raised."""
    try:
        yield
    except BaseException:
        if client is not None:
            try:
                release_batch(client, keys, metrics=metrics)
            except Exception:
                log.warning("releasing %d TQ keys after a failed step failed too; the step's error is raised",
                            len(keys), exc_info=True)
        raise
    if client is not None:
        release_batch(client, keys, metrics=metrics)


def to_torch(sample: Sample) -> dict[str, Any]:
    """The Sample's arrays as torch tensors sharing memory with them (``torch.from_numpy``)."""
    import torch

    return {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in sample.field_arrays().items()}
