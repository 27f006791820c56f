"""``run_memory_bench``: for each dtype, the loop without TQ then with TQ, then the report and the plots.

The two paths of one dtype run back to back in one invocation, each on a fresh cluster, so their ratio
compares like with like. The peak-vs-batch curve is projected with :mod:`dressage.capacity` from the
headline pair measured here (the JSON itself is a valid ``dressage capacity --baseline``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

from dressage_bench.memory.config import MemoryBenchConfig
from dressage_bench.memory.pipeline import PathRun, run_path
from dressage_bench.memory.report import build_report

__all__ = ["run_memory_bench", "batch_size_projection", "write_plots", "MALLOC_ENV"]

# glibc's allocator: with a fixed mmap threshold every array above it is its own mapping, returned to
# the kernel when freed, so PSS follows the live data on both paths instead of heap that a dynamic
# threshold keeps after a release.
MALLOC_ENV = "MALLOC_MMAP_THRESHOLD_"


@contextlib.contextmanager
def _environment(cfg: MemoryBenchConfig) -> Iterator[None]:
    """Variables every process of the cluster inherits (set before the raylets start, restored after)."""
    changes = {"RAY_DEDUP_LOGS": "1"}
    if cfg.malloc_mmap_threshold:
        changes[MALLOC_ENV] = str(cfg.malloc_mmap_threshold)
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _progress(cfg: MemoryBenchConfig, total: int) -> Any:
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="dressage bench memory", unit="rollout")


def run_memory_bench(cfg: MemoryBenchConfig, plot_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Measure every (dtype, path) pair and return the report (with plot paths when ``plot_dir``)."""
    runs: dict[tuple[str, str], PathRun] = {}
    bar = _progress(cfg, len(cfg.dtypes) * 2 * cfg.num_rollouts)

    def tick(label: str) -> None:
        if bar is not None:
            bar.set_postfix_str(label)
            bar.update(1)

    try:
        with _environment(cfg):
            for dtype in cfg.dtypes:
                for with_tq in (False, True):
                    run = run_path(cfg, dtype, with_tq, on_rollout=tick)
                    runs[(dtype, run.path)] = run
    finally:
        if bar is not None:
            bar.close()
    report = build_report(cfg, runs)
    report["batch_size_projection"] = batch_size_projection(report, cfg.batch_sizes)
    if plot_dir is not None:
        report["plots"] = write_plots(report, plot_dir)
    return report


def batch_size_projection(report: dict[str, Any], batch_sizes: tuple[int, ...]) -> dict[str, Any]:
    """Peak M_master at other rollout batch sizes: the capacity model applied to what grows with the data.

    Each process's idle footprint (interpreter, libraries, connections) does not grow with the batch, so
    the model scales only each component's growth above idle and the measured idle sum is added back.
    """
    from dressage.capacity.baseline import baseline_from_dict
    from dressage.capacity.projection import sweep

    growth = {"config": report["config"], "label": report["label"]}
    for path in ("without_tq", "with_tq"):
        block = report[path]
        growth[path] = {"master_peak_bytes": max(1, block["master_above_idle_bytes"]),
                        "components": block["above_idle"]}
    baseline = baseline_from_dict(growth, source="memory report (growth above idle)")
    idle = {p: report[p]["master_idle_bytes"] for p in ("without_tq", "with_tq")}
    points = [{"rollout_batch_size": b, "without_tq": round(idle["without_tq"] + off),
               "with_tq": round(idle["with_tq"] + on)}
              for b, off, on in sweep(baseline.config, baseline, sorted(set(batch_sizes)))]
    return {
        "method": "projected: dressage.capacity on the growth above idle, plus the measured idle footprint",
        "measured": {"rollout_batch_size": baseline.config.rollout_batch_size,
                     "without_tq": report["without_tq"]["master_peak_bytes"],
                     "with_tq": report["with_tq"]["master_peak_bytes"]},
        "idle_bytes": idle,
        "points": points,
    }


def write_plots(report: dict[str, Any], plot_dir: str | os.PathLike[str]) -> dict[str, str]:
    from dressage_bench.memory.plot import plot_batch_sizes, plot_timeline

    out_dir = Path(plot_dir)
    plots = {}
    head = report["routed_experts_dtype"]
    for dtype in report["by_dtype"]:
        name = "timeline" if dtype == head else f"timeline_{dtype}"
        plots[name] = plot_timeline(report, dtype, out_dir / f"memory_{name}.png")
    plots["batch_sizes"] = plot_batch_sizes(report, out_dir / "memory_batch_sizes.png")
    return plots
