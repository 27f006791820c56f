"""Capacity planning for the trajectory data plane: R3 sizing by formula, per-Segment field breakdown,
and projection of master-node peaks with and without TQ from a measured baseline.
"""

from dressage.capacity.baseline import (
    SEED_QWEN_BASELINE,
    WITH_TQ_COMPONENTS,
    WITHOUT_TQ_COMPONENTS,
    Baseline,
    PathMeasurement,
    baseline_from_dict,
    baseline_to_dict,
    load_baseline,
)
from dressage.capacity.config import CapacityConfig, distribution_mean, parse_segments_distribution
from dressage.capacity.plot import plot_projection
from dressage.capacity.projection import (
    Growth,
    ProjectedPath,
    Projection,
    crossing_batch,
    growth,
    max_rollout_batch_size,
    project,
    sweep,
)
from dressage.capacity.report import capacity_report, render_text
from dressage.capacity.sizing import BatchSizing, FieldShare, per_token_bytes, r3_growth, segment_breakdown, size_batch

__all__ = [
    "CapacityConfig", "parse_segments_distribution", "distribution_mean",
    "BatchSizing", "FieldShare", "size_batch", "per_token_bytes", "segment_breakdown", "r3_growth",
    "Baseline", "PathMeasurement", "SEED_QWEN_BASELINE", "WITHOUT_TQ_COMPONENTS", "WITH_TQ_COMPONENTS",
    "baseline_from_dict", "baseline_to_dict", "load_baseline",
    "Growth", "ProjectedPath", "Projection", "growth", "project", "crossing_batch",
    "max_rollout_batch_size", "sweep",
    "plot_projection",
    "capacity_report", "render_text",
]
