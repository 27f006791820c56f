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


def _unit_of(sample: Sample, keep_groups: bool) -> tuple[str, Any]:
    """What a batch may not be cut inside: the Sample's prompt group (``keep_groups``), else its session."""
    if keep_groups and sample.group_index is not None:
        return ("group", sample.group_index)
    return ("session", sample.session_id)


def _cut_whole_units(ready: list[Sample], max_samples: int, *, keep_groups: bool) -> tuple[list[Sample], list[Sample]]:
    """``ready`` split into the whole units (see :meth:`RolloutManager.take_batch`) that fit ``max_samples``,
    in arrival order of each unit's first Sample, and the rest (in queue order)."""
    sizes: dict[tuple[str, Any], int] = {}
    for s in ready:
        unit = _unit_of(s, keep_groups)
        sizes[unit] = sizes.get(unit, 0) + 1
    taken: set[tuple[str, Any]] = set()
    total = 0
    for unit, n in sizes.items():  # first arrival order
        if taken and total + n > max_samples:
            break
        taken.add(unit)
        total += n
    batch = [s for s in ready if _unit_of(s, keep_groups) in taken]
    rest = [s for s in ready if _unit_of(s, keep_groups) not in taken]
    return batch, rest


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

    def withdraw(self, samples: Sequence[Sample]) -> int:
        """Withdraw exactly these queued Samples (not others of their sessions: a session read again and
        queued by a later read stays); returns how many were queued."""
        gone = {id(s) for s in samples}
        with self._lock:
            keep = [s for s in self._ready if id(s) not in gone]
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
        """Take queued Samples (all, or whole units of at most ``max_samples`` in all) and shard them
        for DP ranks.

        With ``max_samples`` the batch is cut between units, never inside one: a session (its Segments
        share their common steps' TQ keys, so releasing one batch's keys would take a later batch's
        rows with them) or, with ``keep_groups``, a prompt group (``group_index``: its sessions stay
        in one batch as they stay on one DP rank). Units are taken in the order their first Sample
        arrived, up to the first that does not fit; a first unit larger than ``max_samples`` is taken
        whole.
        """
        if max_samples is not None and (isinstance(max_samples, bool) or not isinstance(max_samples, int)
                                        or max_samples < 1):
            raise ConfigError(f"max_samples must be a positive integer or None, got {max_samples!r}")
        with self._lock:
            if max_samples is None:
                samples, self._ready = self._ready, []
            else:
                samples, self._ready = _cut_whole_units(self._ready, max_samples, keep_groups=self.keep_groups)
        samples.sort(key=lambda smp: smp.order_key)
        shards = shard_samples(samples, self.dp_size, keep_groups=self.keep_groups)
        return RolloutBatch(rollout_id, samples, shards)

