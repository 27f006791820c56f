"""What a benchmarked system is: a workload of payloads, and a system that puts and reads them back.

Every system measures its own put and get where the work happens (inside the writer and the reader),
so actor-call and process-hop overheads of the harness are not charged to the system under test.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dressage_bench._timing import RoundTiming, Stopwatch
from dressage.errors import DressageError

__all__ = [
    "Part",
    "Workload",
    "BenchSystem",
    "SystemUnavailable",
    "MemcpySystem",
    "make_items",
]

MiB = 1 << 20


class SystemUnavailable(DressageError):
    """A benchmarked system cannot run here (package missing, cluster failed); the message says why."""


@dataclass(frozen=True, slots=True)
class Part:
    """One field of a payload: what a single array of the write looks like."""

    field: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * math.prod(self.shape))


@dataclass(frozen=True, slots=True)
class Workload:
    """``count`` separate writes, each of the arrays ``parts`` describe (one field, or one step's fields).

    ``large`` workloads are one payload of 1-256 MiB; ``small`` ones are the many per-step writes a
    Proxy makes (a 4K-token step's R3 at uint8, its logprobs, or both in one write), read back in one
    batch as a trainer does.
    """

    name: str
    kind: str
    parts: tuple[Part, ...]
    count: int = 1

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError(f"workload {self.name!r} has no parts")

    @property
    def item_bytes(self) -> int:
        """Bytes of one write (all its parts)."""
        return sum(p.nbytes for p in self.parts)

    @property
    def total_bytes(self) -> int:
        return self.item_bytes * self.count


def make_items(workload: Workload, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """Distinct random payloads, one tuple of arrays per write, already written (so no first-touch
    fault lands in a timed round).

    Distinct arrays, not one array put ``count`` times: a repeated 1.25 MiB source would sit in the
    CPU cache and flatter every system's small-put figure.
    """
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(workload.count):
        arrays = []
        for part in workload.parts:
            dtype = np.dtype(part.dtype)
            raw = rng.integers(0, 256, size=part.nbytes, dtype=np.uint8)
            arr = raw.view(dtype).reshape(part.shape)
            if dtype.kind == "f":
                # Random bytes can be NaN patterns; any value is fine for bandwidth, but keep them
                # finite so a system that inspects floats behaves normally.
                np.nan_to_num(arr, copy=False)
            arrays.append(arr)
        items.append(tuple(arrays))
    return items


class BenchSystem(abc.ABC):
    """One system under test. ``start`` may raise :class:`SystemUnavailable`.

    ``run_round`` puts every payload of the workload, reads all of them back, releases them
    (untimed) and returns the two durations.
    """

    name: ClassVar[str]
    across_processes: ClassVar[bool] = False
    """True when writer, StorageUnit and reader are separate processes (the trainer's view)."""

    def start(self) -> None:
        """Bring the system up once before any workload."""

    def prepare(self, workload: Workload) -> None:
        """Allocate and warm whatever a workload needs (untimed)."""

    @abc.abstractmethod
    def run_round(self, workload: Workload) -> RoundTiming:
        ...

    def finish(self, workload: Workload) -> None:
        """Drop what ``prepare`` made, so the next workload starts from the same memory state."""

    def close(self) -> None:
        """Stop every process and free every resource the system started."""

    def describe(self) -> dict[str, object]:
        """Extra facts for the JSON result (where data went, how many processes)."""
        return {}


class MemcpySystem(BenchSystem):
    """The ceiling: ``np.copyto`` into warmed memory for the put and again out of it for the get."""

    name = "memcpy"

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed
        self._src: list[np.ndarray] = []
        self._store: list[np.ndarray] = []
        self._out: list[np.ndarray] = []

    def prepare(self, workload: Workload) -> None:
        self._src = [a for item in make_items(workload, self._seed) for a in item]
        # Written once here so the timed copies hit resident pages, as a reused buffer pool would.
        self._store = [np.ones_like(a) for a in self._src]
        self._out = [np.ones_like(a) for a in self._src]

    def run_round(self, workload: Workload) -> RoundTiming:
        with Stopwatch() as put:
            for dst, src in zip(self._store, self._src):
                np.copyto(dst, src)
        with Stopwatch() as get:
            for dst, src in zip(self._out, self._store):
                np.copyto(dst, src)
        return RoundTiming(put.seconds, get.seconds)

    def finish(self, workload: Workload) -> None:
        self._src, self._store, self._out = [], [], []

    def describe(self) -> dict[str, object]:
        return {"path": "np.copyto into written memory, one thread, same process"}
