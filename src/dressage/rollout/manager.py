"""RolloutManager: finalized Segments -> Samples (refs stay attached) -> DP-sharded batches.

With TQ on, a Sample carries only resident token fields and FieldRefs, so what this manager
holds, and what it passes through Ray, stays small. With TQ off, it holds the materialised
large fields, as the original path does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from dressage.errors import ConfigError
from dressage.trajectory import Sample, shard_samples
from dressage.trajectory.sample import samples_of_session
from dressage.trajectory.pieces import Piece

__all__ = ["RolloutManager", "RolloutBatch", "sample_resident_nbytes", "sample_ref_keys"]


def sample_resident_nbytes(sample: Sample) -> int:
    """Bytes of the arrays a Sample carries itself (token fields and materialised large fields)."""
    return sum(int(a.nbytes) for a in sample.field_arrays().values())


def sample_ref_keys(samples: Sequence[Sample]) -> set[str]:
    """Distinct TQ keys the Samples reference."""
    return {p.value.key for s in samples for pieces in s.remote.values() for p in pieces
            if isinstance(p, Piece) and hasattr(p.value, "key")}


def _own_token_fields(s: Sample) -> None:
    """Copy token fields that are views into someone else's buffer.

    Through Ray, a finalized session arrives as one object and its arrays are views into it; a
    Sample holding such a view keeps every step of the session in the object store until the
    batch is cut. Owning the few token bytes lets that object go (slime builds Samples the same way).
    """
    for name in ("tokens", "loss_mask", "token_versions"):
        a = getattr(s, name)
        if a.base is not None:
            setattr(s, name, a.copy())


@dataclass(slots=True)
class RolloutBatch:
    """One training batch: its Samples and their DP shards."""

    rollout_id: int
    samples: list[Sample]
    shards: list[list[Sample]] = field(default_factory=list)

    @property
    def resident_nbytes(self) -> int:
        return sum(sample_resident_nbytes(s) for s in self.samples)


class RolloutManager:
    """Collects finalized sessions (as the Proxy's sink) and cuts training batches."""

    def __init__(self, *, dp_size: int = 1, keep_groups: bool = True) -> None:
        if not isinstance(dp_size, int) or dp_size <= 0:
            raise ConfigError(f"dp_size must be a positive integer, got {dp_size!r}")
        self.dp_size = dp_size
        self.keep_groups = keep_groups
        self._ready: list[Sample] = []
        self._lock = threading.Lock()
        self._next_index = 0
        self.sessions_received = 0
        self.bytes_received = 0

    def add_finalized(self, done: Any) -> list[Sample]:
        """Convert a :class:`~dressage.proxy.recording.core.FinalizedSession` into Samples and queue them."""
        samples = samples_of_session(done.segments, reward=done.reward, metadata=done.metadata)
        for s in samples:
            _own_token_fields(s)
        return self.add_samples(samples, sessions=1)

    def add_samples(self, samples: Sequence[Sample], *, sessions: int) -> list[Sample]:
        """Queue Samples built elsewhere (e.g. read over a Proxy's ``POST /trajectory/read``) from
        ``sessions`` finalized sessions; each gets the next index, as :meth:`add_finalized` gives."""
        samples = list(samples)
        with self._lock:
            for s in samples:
                s.index = self._next_index
                self._next_index += 1
            self._ready.extend(samples)
            self.sessions_received += sessions
            self.bytes_received += sum(sample_resident_nbytes(s) for s in samples)
        return samples

    __call__ = add_finalized  # usable directly as ProxyCore(sink=manager)

    def discard(self, session_id: str) -> int:
        """Withdraw a session's queued Samples (its trajectory was discarded); returns how many."""
        with self._lock:
            keep = [s for s in self._ready if s.session_id != session_id]
            n = len(self._ready) - len(keep)
            self._ready = keep
        return n

    @property
    def num_ready(self) -> int:
        return len(self._ready)

    def held_nbytes(self) -> int:
        with self._lock:
            return sum(sample_resident_nbytes(s) for s in self._ready)

    def take_batch(self, rollout_id: int, max_samples: int | None = None) -> RolloutBatch:
        """Take queued Samples (all, or the first ``max_samples``) and shard them for DP ranks."""
        with self._lock:
            n = len(self._ready) if max_samples is None else min(max_samples, len(self._ready))
            samples, self._ready = self._ready[:n], self._ready[n:]
        samples.sort(key=lambda smp: smp.order_key)
        shards = shard_samples(samples, self.dp_size, keep_groups=self.keep_groups)
        return RolloutBatch(rollout_id, samples, shards)

