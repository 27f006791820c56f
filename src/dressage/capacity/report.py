"""One capacity answer as plain data (for ``--json``) and as a short text table.

Sizes are integers of bytes in the data; the text rendering uses binary units.
"""

from __future__ import annotations

from typing import Any

from dressage.capacity.baseline import Baseline
from dressage.capacity.config import CapacityConfig
from dressage.capacity.projection import (PATHS, crossing_batch, extrapolation_warnings, max_rollout_batch_size,
                                          project)
from dressage.capacity.sizing import REPRESENTATIONS, segment_breakdown, size_batch
from dressage.units import format_bytes

__all__ = ["capacity_report", "render_text"]


def _path_dict(components: dict[str, float], peak: float) -> dict[str, Any]:
    return {
        "master_peak_bytes": int(round(peak)),
        "master_peak": format_bytes(peak),
        "components": {k: int(round(v)) for k, v in components.items()},
    }


def capacity_report(config: CapacityConfig, baseline: Baseline | None) -> dict[str, Any]:
    """Everything ``dressage capacity`` prints, as JSON-ready data."""
    s = size_batch(config)
    out: dict[str, Any] = {
        "model": {"name": config.model.name, "num_layers": config.model.num_layers,
                  "dense_layers": config.model.dense_layers, "hidden_layers": config.model.hidden_layers,
                  "topk": config.model.topk, "num_experts": config.model.num_experts},
        "context_length": config.context_length,
        "segment_tokens": s.segment_tokens,
        "rollout_batch_size": config.rollout_batch_size,
        "n_samples_per_prompt": config.n_samples_per_prompt,
        "trajectories": s.trajectories,
        "mean_segments": config.mean_segments,
        "segments": s.segments,
        "tokens": s.tokens,
        "routed_experts_dtype": config.routed_experts_dtype,
        "nodes": config.nodes,
        "r3_bytes": s.r3_bytes,
        "r3": format_bytes(s.r3_bytes),
        "r3_bytes_per_segment": s.r3_bytes_per_segment,
        "r3_stored_bytes": s.r3_stored_bytes,
        "r3_bytes_per_storage_unit": int(round(s.r3_bytes_per_storage_unit)),
        "segment_breakdown": {},
    }
    for rep in REPRESENTATIONS:
        shares = segment_breakdown(config, rep)
        out["segment_breakdown"][rep.replace("-", "_")] = {
            "total_bytes": sum(f.bytes for f in shares),
            "fields": {f.name: {"bytes": f.bytes, "share": round(f.share, 6)} for f in shares},
        }
    if baseline is None:
        return out

    p = project(config, baseline)
    out["projection"] = {
        "baseline": baseline.label,
        "baseline_notes": list(baseline.notes),
        "growth": {
            "tokens": p.growth.tokens,
            "cluster_r3": p.growth.r3,
            "segments": p.growth.segments,
            "local_storage_unit_r3": p.growth.local_storage_unit_r3,
        },
        "without_tq": _path_dict(p.without_tq.components, p.without_tq.master_peak_bytes),
        "with_tq": _path_dict(p.with_tq.components, p.with_tq.master_peak_bytes),
        "warnings": extrapolation_warnings(p.growth),
    }
    host = config.host_memory_bytes
    if host is not None:
        out["host_memory"] = {"bytes": host, "human": format_bytes(host)}
        for name in PATHS:
            peak = p.path(name).master_peak_bytes
            out["host_memory"][name] = {
                "fits": peak <= host,
                "crossing_batch": round(crossing_batch(peak, config.rollout_batch_size, host), 2),
                "max_rollout_batch_size": max_rollout_batch_size(config, baseline, name),
            }
    return out


def render_text(report: dict[str, Any]) -> str:
    """A human-readable summary of :func:`capacity_report`."""
    m = report["model"]
    dense = m.get("dense_layers", 0)
    layers = (f"R3 sized by {m['num_layers']} MoE layers (SGLang sends {m['hidden_layers']}, "
              f"{dense} dense layers included: x{m['hidden_layers'] / m['num_layers']:.3f})"
              if dense else f"{m['num_layers']} recorded layers")
    lines = [
        f"model {m['name']}: {layers}, top-{m['topk']}, {m['num_experts']} experts",
        f"batch {report['rollout_batch_size']} x {report['n_samples_per_prompt']} = {report['trajectories']:,} "
        f"trajectories, {report['mean_segments']:g} Segment(s) each = {report['segments']:,} Segments "
        f"of {report['segment_tokens']:,} tokens (context {report['context_length']:,})",
        f"R3 ({report['routed_experts_dtype']}): {report['r3']} ({report['r3_bytes']:,} bytes); "
        f"per StorageUnit over {report['nodes']} node(s): {format_bytes(report['r3_bytes_per_storage_unit'])}",
        "",
        "one Segment, by field        numpy              python lists",
    ]
    np_rep, py_rep = report["segment_breakdown"]["numpy"], report["segment_breakdown"]["python_list"]
    for name, f in np_rep["fields"].items():
        g = py_rep["fields"][name]
        lines.append(f"  {name:<16} {format_bytes(f['bytes']):>10} {f['share']:7.1%}"
                     f"   {format_bytes(g['bytes']):>10} {g['share']:7.1%}")
    lines.append(f"  {'total':<16} {format_bytes(np_rep['total_bytes']):>10}{'':8}   "
                 f"{format_bytes(py_rep['total_bytes']):>10}")
    proj = report.get("projection")
    if proj:
        g = proj["growth"]
        lines += [
            "",
            f"projection from {proj['baseline']}",
            f"  growth: tokens x{g['tokens']:.3g}, cluster R3 x{g['cluster_r3']:.3g}, "
            f"master StorageUnit R3 x{g['local_storage_unit_r3']:.3g}",
        ]
        for name, title in (("without_tq", "w/o TQ"), ("with_tq", "w/ TQ ")):
            path = proj[name]
            parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in path["components"].items())
            lines.append(f"  {title} master peak {path['master_peak']:>10}  ({parts})")
    host = report.get("host_memory")
    if host:
        lines.append("")
        lines.append(f"host memory {host['human']}:")
        for name, title in (("without_tq", "w/o TQ"), ("with_tq", "w/ TQ ")):
            h = host[name]
            lines.append(f"  {title} {'fits' if h['fits'] else 'does NOT fit'}; largest rollout batch size "
                         f"{h['max_rollout_batch_size']:,} (crossing at {h['crossing_batch']:,})")
    for warning in (proj or {}).get("warnings", ()):  # last: beside the advice it qualifies
        lines += ["", f"warning: {warning}"]
    return "\n".join(lines)
