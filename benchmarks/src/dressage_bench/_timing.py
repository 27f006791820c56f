"""Timing helpers shared by the benchmarks: clocks, medians, bandwidth and interleaved rounds.

Machines here are noisy (shared cores, first-touch page faults), so every benchmark warms up untimed,
runs its systems alternately round by round in one process and reports medians, never single runs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence, TypeVar

import numpy as np

__all__ = [
    "clock",
    "Stopwatch",
    "RoundTiming",
    "Samples",
    "gbps",
    "median",
    "percentile_ms",
    "interleaved",
    "timed",
]

T = TypeVar("T")

# One clock for every figure, so put/get measured in different processes stay comparable.
clock = time.perf_counter


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``; cheap enough for 16 KiB operations."""

    __slots__ = ("_start", "seconds")

    def __init__(self) -> None:
        self._start = 0.0
        self.seconds = 0.0

    def __enter__(self) -> "Stopwatch":
        self._start = clock()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = clock() - self._start


@dataclass(frozen=True, slots=True)
class RoundTiming:
    """Seconds one round spent writing (put) and reading back (get) the same bytes."""

    put_s: float
    get_s: float

    @property
    def roundtrip_s(self) -> float:
        return self.put_s + self.get_s


@dataclass(slots=True)
class Samples:
    """The timed rounds of one system on one workload."""

    rounds: list[RoundTiming] = field(default_factory=list)

    def add(self, timing: RoundTiming) -> None:
        self.rounds.append(timing)

    def __len__(self) -> int:
        return len(self.rounds)

    @property
    def put_s(self) -> float:
        return median(r.put_s for r in self.rounds)

    @property
    def get_s(self) -> float:
        return median(r.get_s for r in self.rounds)

    @property
    def roundtrip_s(self) -> float:
        # Median of per-round sums, not the sum of medians: a round is what a trainer waits for.
        return median(r.roundtrip_s for r in self.rounds)

    @property
    def roundtrip_range_s(self) -> tuple[float, float]:
        """Fastest and slowest round: how noisy the machine was while this system ran."""
        values = [r.roundtrip_s for r in self.rounds]
        return min(values), max(values)


def median(values: Iterable[float]) -> float:
    data = list(values)
    if not data:
        raise ValueError("median of no samples")
    return float(statistics.median(data))


def percentile_ms(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (seconds) in milliseconds; NaN when there are none."""
    return float(np.percentile(np.asarray(values), q)) * 1000.0 if len(values) else float("nan")


def gbps(nbytes: int, seconds: float) -> float:
    """Decimal GB/s (1e9 bytes per second), the unit every table and JSON figure uses."""
    if seconds <= 0.0:
        # A clock tick of zero means the operation was below timer resolution; report the
        # bound the clock allows rather than an infinity that breaks JSON and ratios.
        seconds = time.get_clock_info("perf_counter").resolution or 1e-9
    return nbytes / seconds / 1e9


def interleaved(systems: Sequence[T], rounds: int) -> Iterable[tuple[int, T]]:
    """``(round, system)`` with the order rotated each round.

    Alternating A/B/C then B/C/A ... spreads slow drifts of the machine (another job starting,
    the page cache filling) over every system instead of charging them to whichever ran last.
    """
    n = len(systems)
    for r in range(rounds):
        for i in range(n):
            yield r, systems[(r + i) % n]


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` took."""
    start = clock()
    fn()
    return clock() - start
