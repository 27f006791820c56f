"""The memory benchmark's report: the seed's component table per dtype, M_master ratios, targets, JSON.

The JSON's top level is the headline dtype's pair in the schema ``dressage capacity --baseline`` reads
(``without_tq`` / ``with_tq`` with ``master_peak_bytes`` and ``components``, plus ``config``); every dtype's
pair, the idle levels, logical sizes and the timelines sit beside it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from pathlib import Path
from typing import Any, Mapping

from dressage_bench.memory.config import MemoryBenchConfig
from dressage_bench.memory.pipeline import METRIC_COMPONENTS, PathRun
from dressage.units import format_bytes

__all__ = ["build_report", "format_table", "write_json", "TARGETS", "LABELS"]

LABELS = {
    "proxy": "Proxy", "rollout_manager": "RolloutManager", "object_store": "Ray Object Store (master)",
    "tq_controller": "TQ Controller", "tq_storage_unit_master": "TQ StorageUnit (master)",
}
# (name, component or None for M_master, limit on with/without): the targets.
TARGETS = (
    ("master_peak_ratio", None, 0.10),
    ("rollout_manager_ratio", "rollout_manager", 0.02),
    ("object_store_ratio", "object_store", 0.02),
    ("proxy_ratio", "proxy", 0.25),
)


def ray_actor_components(proxy_deployment: str) -> tuple[str, ...]:
    """Components that are one Ray actor process each, compared with the floor of such a process too
    (the Proxy only when it runs as a Ray actor)."""
    return ("rollout_manager", "proxy") if proxy_deployment == "ray" else ("rollout_manager",)


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 else None


def _path_block(run: PathRun) -> dict[str, Any]:
    peaks = run.peaks()
    comps = {c: peaks[c] for c in run.components}
    master, when = run.master_peak()
    idle = {c: run.idle.get(c, 0) for c in run.components}
    return {
        "master_peak_bytes": master,
        "master_peak_t": round(when, 3),
        "components": comps,
        "idle": idle,
        "above_idle": {c: max(0, comps[c] - idle[c]) for c in run.components},
        "master_idle_bytes": sum(idle.values()),
        "master_above_idle_bytes": max(0, master - sum(idle.values())),
        "outside_metric": {n: peaks[n] for n in run.timeline.names if n not in run.components},
        "logical": dict(run.logical),
        "counts": dict(run.counts),
        "rollouts": run.rollouts,
        "samples_digest": run.digest,
        "samples": len(run.timeline.t),
        "wall_s": round(run.wall_s, 2),
        "rollout_s": [r["phase_s"]["rollout"] for r in run.rollouts if "phase_s" in r],
        "ray_actor_floor_bytes": run.idle.get("ray_actor_floor", 0),
    }


def _pair(off: PathRun, on: PathRun) -> dict[str, Any]:
    a, b = _path_block(off), _path_block(on)
    change = {}
    for c in METRIC_COMPONENTS["with_tq"]:
        x, y = a["components"].get(c), b["components"][c]
        change[c] = None if not x else round(y / x - 1.0, 4)
    return {
        "without_tq": a, "with_tq": b,
        "master_peak_ratio": _ratio(b["master_peak_bytes"], a["master_peak_bytes"]),
        "master_above_idle_ratio": _ratio(b["master_above_idle_bytes"], a["master_above_idle_bytes"]),
        "component_ratios": {c: _ratio(b["components"][c], a["components"][c])
                             for c in METRIC_COMPONENTS["without_tq"]},
        "component_above_idle_ratios": {c: _ratio(b["above_idle"][c], a["above_idle"][c])
                                        for c in METRIC_COMPONENTS["without_tq"]},
        "change": change,
        "samples_digest_match": a["samples_digest"] == b["samples_digest"],
        "wall_ratio": _ratio(b["wall_s"], a["wall_s"]),
    }


def _capacity_config(cfg: MemoryBenchConfig, run: PathRun, dtype: str) -> dict[str, Any]:
    """The run's shape in the capacity model's terms (Segments per trajectory, tokens per Segment)."""
    m = cfg.model
    segments = max(1, run.counts.get("segments", 0))
    trajectories = max(1, cfg.trajectories * cfg.num_rollouts)
    return {
        "model": {"name": m.name, "num_layers": m.num_layers, "topk": m.topk, "num_experts": m.num_experts},
        "context_length": cfg.context_length,
        "rollout_batch_size": cfg.rollout_batch_size,
        "n_samples_per_prompt": cfg.n_samples_per_prompt,
        "nodes": 2,
        "routed_experts_dtype": dtype,
        "mean_segments": round(segments / trajectories, 4),
        "mean_segment_tokens": max(1, min(cfg.context_length, round(run.counts.get("tokens", 0) / segments))),
        "representation": "numpy",
    }


def _targets(pairs: Mapping[str, dict[str, Any]], dtype: str, ray_actors: tuple[str, ...]) -> list[dict[str, Any]]:
    pair = pairs[dtype]
    out = []
    for name, comp, limit in TARGETS:
        if comp is None:
            value, above = pair["master_peak_ratio"], pair["master_above_idle_ratio"]
        else:
            value, above = pair["component_ratios"][comp], pair["component_above_idle_ratios"][comp]
        row = {"name": name, "dtype": dtype, "value": value, "limit": limit,
               "met": value is not None and value <= limit, "above_idle_value": above,
               "above_idle_met": above is not None and above <= limit}
        if comp in ray_actors:
            # The part of the figure above what any Ray actor process costs before it runs our code.
            floor = min(pair["without_tq"]["ray_actor_floor_bytes"], pair["with_tq"]["ray_actor_floor_bytes"])
            on, off = pair["with_tq"]["components"][comp], pair["without_tq"]["components"][comp]
            row.update(floor_bytes=floor, above_floor_value=_ratio(max(0, on - floor), max(0, off - floor)))
        out.append(row)
    return out


def targets_note(preset: str) -> str | None:
    """Why a run's targets say little: they are defined for the full preset, not for a quick check."""
    if preset == "full":
        return None
    return (f"note: the {preset} preset's sizes cannot meet the targets as defined: they are for --preset full "
            "(at small batches the processes' idle footprint dominates), so the verdicts above are indicative "
            "only; run --preset full to check them")


def build_report(cfg: MemoryBenchConfig, runs: Mapping[tuple[str, str], PathRun]) -> dict[str, Any]:
    """``runs[(dtype, path)]`` -> the full report (JSON-ready)."""
    dtypes = [d for d in cfg.dtypes if (d, "without_tq") in runs and (d, "with_tq") in runs]
    pairs = {d: _pair(runs[(d, "without_tq")], runs[(d, "with_tq")]) for d in dtypes}
    head = cfg.headline_dtype
    top = pairs[head]
    report: dict[str, Any] = {
        "benchmark": "memory",
        "label": f"measured: dressage bench memory --preset {cfg.preset}, {head}",
        "routed_experts_dtype": head,
        "without_tq": top["without_tq"],
        "with_tq": top["with_tq"],
        "master_peak_ratio": top["master_peak_ratio"],
        "master_above_idle_ratio": top["master_above_idle_ratio"],
        "wall_ratio": top["wall_ratio"],
        "config": _capacity_config(cfg, runs[(head, "with_tq")], head),
        "bench_config": cfg.to_dict(),
        "by_dtype": pairs,
        "targets": _targets(pairs, head, ray_actor_components(cfg.proxy_deployment)),
        "targets_note": targets_note(cfg.preset),
        "method": {
            "metric": "M_master = PSS(Proxy) + PSS(RolloutManager) + ObjectStore(master) + PSS(TQ Controller) + "
                      "PSS(TQ StorageUnit on master)",
            "pss": "per process Pss - Pss_Shmem (smaps_rollup); shared-memory files counted once by st_blocks*512",
            "object_store": "st_blocks*512 of the master raylet's plasma file (physical); logical = bytes used",
            "sampling_s": cfg.interval_s,
            "peaks": "each component's own peak and the peak of the sum at one instant, after the warm-up",
            "idle": "mean of each component over the idle second after the warm-up session",
        },
        "environment": {"python": platform.python_version(), "machine": platform.machine(),
                        "cpus": os.cpu_count(), "time": _dt.datetime.now(_dt.timezone.utc).isoformat()},
    }
    if "int32" in pairs and head != "int32":
        base = pairs["int32"]["without_tq"]["master_peak_bytes"]
        report["with_tq_vs_int32_without_tq_ratio"] = _ratio(top["with_tq"]["master_peak_bytes"], base)
    report["timelines"] = {d: {p: runs[(d, p)].timeline.to_dict() for p in ("without_tq", "with_tq")}
                           for d in dtypes}
    return report


def _row(label: str, a: int | None, b: int | None, change: str, extra: str = "") -> str:
    fa = "-" if a is None else format_bytes(a)
    fb = "-" if b is None else format_bytes(b)
    return f"  {label:<28}{fa:>12}{fb:>12}  {change:<36}{extra}"


def format_table(report: Mapping[str, Any]) -> str:
    """The seed's component table for every dtype, then the M_master summary and the targets."""
    cfg = report["bench_config"]
    m = cfg["model"]
    lines = [f"dressage bench memory: preset {cfg['preset']}, {m['name']} shapes ({m['num_layers']} layers, "
             f"top-{m['topk']}, {m['num_experts']} experts), {cfg['rollout_batch_size']} x "
             f"{cfg['n_samples_per_prompt']} trajectories, context {cfg['context_length']}, "
             f"{cfg['num_rollouts']} rollouts, 2 simulated nodes, placement {cfg['placement']}"]
    deployment = cfg.get("proxy_deployment", "ray")  # reports from before the setting ran it as a Ray actor
    lines.append("  the Proxy: " + ("its own process outside Ray; the RolloutManager drains it over "
                                    "/trajectory/read" if deployment == "process" else
                                    "a Ray actor pushing each finalized session to the RolloutManager"))
    for dtype, pair in report["by_dtype"].items():
        a, b = pair["without_tq"], pair["with_tq"]
        lines += ["", f"R3 stored as {dtype}: peak PSS per component (above idle in brackets)",
                  f"  {'component':<28}{'w/o TQ':>12}{'w/ TQ':>12}  {'change':<36}"]
        for c in METRIC_COMPONENTS["with_tq"]:
            x, y = a["components"].get(c), b["components"][c]
            ch = pair["change"][c]
            change = "new independent data storage" if x is None else f"{ch * 100:+.1f}%"
            extra = (f"[{format_bytes(a['above_idle'][c]) if x is not None else '-'} -> "
                     f"{format_bytes(b['above_idle'][c])}]")
            lines.append(_row(LABELS[c], x, y, change, extra))
        ratio = pair["master_peak_ratio"]
        lines.append(_row("M_master (peak of the sum)", a["master_peak_bytes"], b["master_peak_bytes"],
                          f"ratio {ratio:.3f}" if ratio is not None else "-",
                          f"[{format_bytes(a['master_above_idle_bytes'])} -> "
                          f"{format_bytes(b['master_above_idle_bytes'])}, "
                          f"ratio {pair['master_above_idle_ratio']}]"))
        lines.append(f"  same training data on both paths (samples digest): "
                     f"{'yes' if pair['samples_digest_match'] else 'NO'}")
        lines.append(f"  wall: {a['wall_s']:.1f} s -> {b['wall_s']:.1f} s, ratio {pair['wall_ratio']}; rollouts "
                     f"{', '.join(f'{x:.1f}' for x in a['rollout_s'])} s -> "
                     f"{', '.join(f'{x:.1f}' for x in b['rollout_s'])} s")
        actors = " and ".join(LABELS[c] for c in reversed(ray_actor_components(deployment)))
        lines.append(f"  a bare Ray actor process here (the floor of {actors}): "
                     f"{format_bytes(b['ray_actor_floor_bytes'])}")
    lines += ["", "M_master peaks", f"  {'dtype':<8}{'w/o TQ':>12}{'w/ TQ':>12}{'ratio':>9}"]
    for dtype, pair in report["by_dtype"].items():
        lines.append(f"  {dtype:<8}{format_bytes(pair['without_tq']['master_peak_bytes']):>12}"
                     f"{format_bytes(pair['with_tq']['master_peak_bytes']):>12}{pair['master_peak_ratio']:>9.3f}")
    if "with_tq_vs_int32_without_tq_ratio" in report:
        lines.append(f"  w/ TQ {report['routed_experts_dtype']} vs w/o TQ int32 (the original path): "
                     f"{report['with_tq_vs_int32_without_tq_ratio']:.3f}")
    lines += ["", f"targets ({report['routed_experts_dtype']}, ratios measured in this run)"]
    for t in report["targets"]:
        lines.append(f"  {t['name']:<24} {t['value']!s:>8} <= {t['limit']:<5} {'met' if t['met'] else 'MISSED':<7}"
                     f" above idle: {t['above_idle_value']} ({'met' if t['above_idle_met'] else 'missed'})"
                     + (f", above the Ray actor floor: {t['above_floor_value']}" if "above_floor_value" in t else ""))
    if report.get("targets_note"):
        lines.append(report["targets_note"])
    if report.get("batch_size_projection"):
        proj = report["batch_size_projection"]
        lines += ["", f"peak M_master vs rollout batch size ({proj['method']})"]
        for p in proj["points"]:
            lines.append(f"  batch {p['rollout_batch_size']:>6}: w/o TQ {format_bytes(p['without_tq']):>10}"
                         f"   w/ TQ {format_bytes(p['with_tq']):>10}")
    for name, path in (report.get("plots") or {}).items():
        lines.append(f"plot {name}: {path}")
    return "\n".join(lines)


def write_json(report: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    target = Path(path)
    if target.parent and not target.parent.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
