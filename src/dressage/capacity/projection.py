"""Project master-node peaks with and without TQ from a measured baseline to a target configuration.

The baseline pairs each component on both paths, which splits it into what stays resident with TQ
(ordinary fields, scaled by token volume) and the large fields TQ moves away (R3 and logprobs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from dressage.capacity.baseline import RESIDENT_COMPONENTS, Baseline
from dressage.capacity.config import CapacityConfig
from dressage.capacity.sizing import per_token_bytes, size_batch
from dressage.errors import ConfigError

__all__ = [
    "PATHS",
    "Growth",
    "ProjectedPath",
    "Projection",
    "growth",
    "project",
    "crossing_batch",
    "extrapolation_warnings",
    "FAR_EXTRAPOLATION",
    "max_rollout_batch_size",
    "sweep",
]

PATHS = ("without_tq", "with_tq")


@dataclass(frozen=True, slots=True, kw_only=True)
class Growth:
    """Target over baseline, factor by factor."""

    tokens: float
    """Token volume (Segments x tokens per Segment): scales every ordinary token field."""
    r3: float
    """Cluster-wide R3 bytes: token volume x recorded layers x top-k x dtype width."""
    segments: float
    """Active Segments: scales per-key metadata (the TQ Controller)."""
    nodes: float
    """Baseline StorageUnits over target StorageUnits: the master's share of TQ data."""

    @property
    def local_storage_unit_r3(self) -> float:
        """R3 the master's own StorageUnit holds, relative to the baseline's."""
        return self.r3 * self.nodes


@dataclass(frozen=True, slots=True, kw_only=True)
class ProjectedPath:
    components: dict[str, float]
    """Projected independent peak of each component (bytes)."""
    master_peak_bytes: float
    """Projected peak of the master-node data plane: the components' sum times the baseline overlap."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Projection:
    baseline_label: str
    growth: Growth
    without_tq: ProjectedPath
    with_tq: ProjectedPath

    def path(self, name: str) -> ProjectedPath:
        if name not in PATHS:
            raise ConfigError(f"path must be one of {', '.join(PATHS)}, got {name!r}")
        return getattr(self, name)


def growth(config: CapacityConfig, baseline: Baseline) -> Growth:
    target, base = size_batch(config), size_batch(baseline.config)
    return Growth(
        tokens=target.tokens / base.tokens,
        r3=target.r3_bytes / base.r3_bytes,
        segments=target.segments / base.segments,
        nodes=baseline.config.nodes / config.nodes,
    )


def _r3_fraction(baseline: Baseline, representation: str) -> float:
    """R3's part of the large fields (R3 + logprobs) at the baseline, in ``representation``."""
    costs = per_token_bytes(baseline.config, representation)
    return costs["routed_experts"] / (costs["routed_experts"] + costs["logprobs"])


def project(config: CapacityConfig, baseline: Baseline) -> Projection:
    """Scale every measured component of ``baseline`` to ``config``; see docs/capacity.md for the model."""
    g = growth(config, baseline)
    # Large fields grow as a blend: R3 by g.r3, logprobs by token volume.
    off_r3 = _r3_fraction(baseline, baseline.representation)
    large_off = off_r3 * g.r3 + (1.0 - off_r3) * g.tokens
    tq_r3 = _r3_fraction(baseline, "numpy")  # StorageUnits always hold dense arrays
    large_tq = tq_r3 * g.r3 + (1.0 - tq_r3) * g.tokens

    off, on = baseline.without_tq.components, baseline.with_tq.components
    without: dict[str, float] = {}
    for name in RESIDENT_COMPONENTS:
        # What a component keeps with TQ on is what it holds besides the offloaded fields.
        ordinary = min(off[name], on[name])
        without[name] = ordinary * g.tokens + (off[name] - ordinary) * large_off
    with_tq = {name: on[name] * g.tokens for name in RESIDENT_COMPONENTS}
    with_tq["tq_controller"] = on["tq_controller"] * g.segments
    with_tq["tq_storage_unit_master"] = on["tq_storage_unit_master"] * large_tq * g.nodes

    return Projection(
        baseline_label=baseline.label,
        growth=g,
        without_tq=ProjectedPath(components=without, master_peak_bytes=_master_peak(without, baseline.without_tq.overlap)),
        with_tq=ProjectedPath(components=with_tq, master_peak_bytes=_master_peak(with_tq, baseline.with_tq.overlap)),
    )


def _master_peak(components: dict[str, float], overlap: float) -> float:
    """The components' sum times the baseline's overlap, and never less than the largest of them: where one
    component grows far past the others, the overlap measured among comparable ones would put the peak
    under that component alone."""
    return max(sum(components.values()) * overlap, max(components.values(), default=0.0))


FAR_EXTRAPOLATION = 100.0
"""Token growth past which a projection says it extrapolates far: a small run's peaks are mostly fixed
costs (interpreters, libraries, pools) that the linear model scales as if they were per-token data."""


def extrapolation_warnings(g: Growth) -> list[str]:
    """What a reader of the projection must be told about how far it reaches (empty: nothing)."""
    if g.tokens <= FAR_EXTRAPOLATION:
        return []
    return [f"the baseline is far smaller than the target (tokens x{g.tokens:,.0f}): its fixed costs are scaled "
            "as if they grew with tokens, so every projected peak (and the largest batch that fits) may be "
            "wrong by a wide margin, the advice with and without TQ included; measure a baseline within "
            f"x{FAR_EXTRAPOLATION:g} of the target's tokens, or leave out --baseline to project from the seed's "
            "figures"]


def crossing_batch(peak_bytes: float, rollout_batch_size: int, host_memory_bytes: float) -> float:
    """Batch size at which a peak proportional to batch size reaches the host memory.

    ``crossing_batch(3.84 TiB, 512, 2 TB)`` is 242.5: the seed's "approximately 243".
    """
    if not peak_bytes > 0 or not host_memory_bytes > 0 or rollout_batch_size <= 0:
        raise ConfigError("crossing_batch needs a positive peak, batch size and host memory")
    return rollout_batch_size * host_memory_bytes / peak_bytes


def _peak(config: CapacityConfig, baseline: Baseline, path: str, batch: int) -> float:
    return project(replace(config, rollout_batch_size=batch), baseline).path(path).master_peak_bytes


def max_rollout_batch_size(config: CapacityConfig, baseline: Baseline, path: str,
                           host_memory_bytes: int | None = None) -> int:
    """Largest rollout batch size whose projected peak on ``path`` fits the host memory (0 if none)."""
    host = config.host_memory_bytes if host_memory_bytes is None else host_memory_bytes
    if host is None or host <= 0:
        raise ConfigError("--host-memory is needed for the largest batch that fits")
    peak = project(config, baseline).path(path).master_peak_bytes
    guess = max(1, math.floor(crossing_batch(peak, config.rollout_batch_size, host)))
    # The peak is proportional to batch size up to rounding of the Segment count; settle exactly.
    while _peak(config, baseline, path, guess + 1) <= host:
        guess += 1
    while guess > 0 and _peak(config, baseline, path, guess) > host:
        guess -= 1
    return guess


def sweep(config: CapacityConfig, baseline: Baseline, batch_sizes: Iterable[int]) -> list[tuple[int, float, float]]:
    """``(batch, peak without TQ, peak with TQ)`` for each batch size, for curves like the seed's Figure 5."""
    out = []
    for batch in batch_sizes:
        p = project(replace(config, rollout_batch_size=int(batch)), baseline)
        out.append((int(batch), p.without_tq.master_peak_bytes, p.with_tq.master_peak_bytes))
    return out
