"""Projected master-node peak against rollout batch size, with the host-memory line (the seed's Figure 5).

Rendered with matplotlib's Agg backend, so it works on headless machines; matplotlib is the
``plot`` extra and is imported only when a plot is asked for.
"""

from __future__ import annotations

from pathlib import Path

from dressage.capacity.baseline import Baseline
from dressage.capacity.config import CapacityConfig
from dressage.capacity.projection import max_rollout_batch_size, sweep
from dressage.errors import ConfigError

__all__ = ["plot_projection", "path_labels"]

_TIB = 2**40


def _batch_axis(config: CapacityConfig, limits: list[int], points: int = 64) -> list[int]:
    # Frame the configured batch and the nearest threshold; a far one is named in the legend instead.
    fitting = [b for b in limits if b > 0]
    upper = max(2 * config.rollout_batch_size, int(1.25 * min(fitting)) if fitting else 0)
    step = max(1, upper // points)
    return sorted({*range(step, upper + 1, step), config.rollout_batch_size, *(b for b in fitting if b <= upper)})


def path_labels(config: CapacityConfig, limits: list[int] | None = None) -> tuple[str, str]:
    """Legend labels of the two curves: each names the R3 dtype it is priced at, and the largest
    batch that fits when ``limits`` (without TQ, with TQ) are given."""
    fits = [f"; fits up to batch {b:,}" for b in limits] if limits else ["", ""]
    dtype = config.routed_experts_dtype
    return (f"w/o TQ (R3 {dtype}){fits[0]}",
            f"w/ TQ (R3 {dtype}, {config.nodes} StorageUnits){fits[1]}")


def plot_projection(config: CapacityConfig, baseline: Baseline, path: str | Path) -> Path:
    """Write a PNG of both paths' projected peak against batch size; return its path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib: pip install 'dressage[plot]'") from exc

    host = config.host_memory_bytes
    limits = [max_rollout_batch_size(config, baseline, p) for p in ("without_tq", "with_tq")] if host else []
    rows = sweep(config, baseline, _batch_axis(config, limits))
    batches = [r[0] for r in rows]

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    try:
        without_label, with_label = path_labels(config, limits if host else None)
        ax.plot(batches, [r[1] / _TIB for r in rows], label=without_label, color="tab:red")
        ax.plot(batches, [r[2] / _TIB for r in rows], color="tab:blue", label=with_label)
        at = [r for r in rows if r[0] == config.rollout_batch_size][0]
        ax.scatter([at[0]] * 2, [at[1] / _TIB, at[2] / _TIB], color="black", zorder=3,
                   label=f"batch {config.rollout_batch_size}")
        if host:
            ax.axhline(host / _TIB, color="gray", linestyle="--", label=f"host memory {host / _TIB:.2f} TiB")
            for limit, color in zip(limits, ("tab:red", "tab:blue")):
                if 0 < limit <= batches[-1]:
                    ax.axvline(limit, color=color, linestyle=":", linewidth=1)
                    ax.annotate(f"{limit}", (limit, host / _TIB), textcoords="offset points",
                                xytext=(4, 6), color=color, fontsize=8)
        ax.set_xlabel("rollout batch size (prompts)")
        ax.set_ylabel("projected master-node data-plane peak (TiB)")
        ax.set_title(
            f"{config.model.name}, {config.context_length // 1024}K context, "
            f"{config.n_samples_per_prompt} samples/prompt, {config.mean_segments:g} Segment(s)/trajectory",
            fontsize=10,
        )
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        fig.text(0.01, 0.01, f"baseline: {baseline.label}", fontsize=7, color="dimgray")
        out = Path(path)
        try:
            fig.savefig(out, format="png")
        except OSError as exc:
            raise ConfigError(f"--plot: cannot write {str(out)!r}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return out
