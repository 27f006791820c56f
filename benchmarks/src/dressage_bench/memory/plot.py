"""PNGs of the memory benchmark: M_master and each component over time (the seed's Figure 4) and the
peak M_master against rollout batch size for both paths (the seed's Figure 5 shape)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from dressage_bench.memory.pipeline import METRIC_COMPONENTS
from dressage_bench.memory.report import LABELS
from dressage.errors import ConfigError

__all__ = ["plot_timeline", "plot_batch_sizes", "path_titles"]

_GIB = float(1 << 30)
_COLORS = {"proxy": "tab:blue", "rollout_manager": "tab:orange", "object_store": "tab:green",
           "tq_controller": "tab:purple", "tq_storage_unit_master": "tab:red"}


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("--plot-dir needs matplotlib (pip install 'dressage[plot]')") from exc
    return plt


def path_titles(dtype: str) -> tuple[str, str]:
    """Names of the two paths in titles and legends, each with the R3 dtype it ran with."""
    return f"w/o TQ (R3 {dtype})", f"w/ TQ (R3 {dtype})"


def plot_timeline(report: Mapping[str, Any], dtype: str, path: str | os.PathLike[str]) -> str:
    """Two panels (w/o TQ, w/ TQ) on one y scale: M_master and each of its components, in GiB."""
    plt = _pyplot()
    timelines = report["timelines"][dtype]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), sharey=True)
    for ax, name, title in zip(axes, ("without_tq", "with_tq"), path_titles(dtype)):
        tl = timelines[name]
        t = tl["t"]
        start = next((m["t"] for m in tl["marks"] if m["label"] == "measure"), 0.0)
        xs = [x - start for x in t]
        ax.plot(xs, [v / _GIB for v in tl["master"]], color="black", lw=2.2, label="M_master")
        for comp in METRIC_COMPONENTS[name]:
            ax.plot(xs, [v / _GIB for v in tl["values"][comp]], color=_COLORS[comp], lw=1.2, label=LABELS[comp])
        for m in tl["marks"]:
            if m["label"].startswith(("batch", "release")):
                ax.axvline(m["t"] - start, color="grey", lw=0.6, ls=":" if m["label"].startswith("batch") else "--")
        peak = report["by_dtype"][dtype][name]["master_peak_bytes"] / _GIB
        ax.set_title(f"{title}: peak M_master {peak:.2f} GiB")
        ax.set_xlabel("time since measurement start (s); dotted: batch cut, dashed: batch released")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("memory (GiB; PSS, shared memory once)")
    axes[1].legend(loc="upper right", fontsize=8)
    ratio = report["by_dtype"][dtype]["master_peak_ratio"]
    fig.suptitle(f"Master-node trajectory data plane, R3 as {dtype} (peak ratio w/ TQ / w/o TQ = {ratio:.3f})")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return os.fspath(path)


def plot_batch_sizes(report: Mapping[str, Any], path: str | os.PathLike[str]) -> str:
    """Peak M_master vs rollout batch size for both paths, from the report's batch-size projection."""
    plt = _pyplot()
    proj = report["batch_size_projection"]
    xs = [p["rollout_batch_size"] for p in proj["points"]]
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    without_label, with_label = path_titles(report["routed_experts_dtype"])
    ax.plot(xs, [p["without_tq"] / _GIB for p in proj["points"]], "o-", color="tab:orange", label=without_label)
    ax.plot(xs, [p["with_tq"] / _GIB for p in proj["points"]], "o-", color="tab:blue", label=with_label)
    measured = proj["measured"]
    ax.plot([measured["rollout_batch_size"]] * 2,
            [measured["without_tq"] / _GIB, measured["with_tq"] / _GIB], "k*", ms=11, label="measured here")
    host = report["bench_config"].get("host_memory_bytes")
    if host:
        ax.axhline(host / _GIB, color="grey", ls="--", lw=1, label=f"host memory {host / _GIB:.0f} GiB")
    ax.set_xlabel(f"rollout batch size (x {report['config']['n_samples_per_prompt']} samples per prompt)")
    ax.set_ylabel("peak M_master (GiB)")
    ax.set_title("Peak master-node data plane vs rollout batch size\n"
                 "(projected by dressage.capacity from the pair measured here; growth above idle + idle)",
                 fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return os.fspath(path)
