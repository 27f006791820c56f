"""Measured baselines: per-component master-node peaks with and without TQ, and the run they came from.

A baseline is the memory benchmark's JSON (bytes, PSS) or the seed's published Qwen3.6-35B-A3B
figures, built in and labelled as such. Every missing or bad key is a ConfigError naming it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dressage.capacity.config import CapacityConfig
from dressage.capacity.sizing import REPRESENTATIONS
from dressage.errors import ConfigError
from dressage.fields.models import ModelSpec, get_model
from dressage.fields.r3 import check_dtype_holds_experts, r3_dtype
from dressage.units import parse_count

__all__ = [
    "RESIDENT_COMPONENTS",
    "WITHOUT_TQ_COMPONENTS",
    "WITH_TQ_COMPONENTS",
    "PathMeasurement",
    "Baseline",
    "SEED_QWEN_BASELINE",
    "baseline_from_dict",
    "baseline_to_dict",
    "load_baseline",
]

# Components on the master node that exist on both paths.
RESIDENT_COMPONENTS = ("proxy", "rollout_manager", "object_store")
WITHOUT_TQ_COMPONENTS = RESIDENT_COMPONENTS
WITH_TQ_COMPONENTS = RESIDENT_COMPONENTS + ("tq_controller", "tq_storage_unit_master")
_CONFIG_KEYS = (
    "model", "context_length", "rollout_batch_size", "n_samples_per_prompt",
    "nodes", "routed_experts_dtype", "mean_segments",
)
_GIB = 2**30


@dataclass(frozen=True, slots=True, kw_only=True)
class PathMeasurement:
    """Master-node peak of one path and the independent peak of each component (bytes)."""

    master_peak_bytes: int
    components: Mapping[str, int]

    @property
    def component_sum(self) -> int:
        return sum(self.components.values())

    @property
    def overlap(self) -> float:
        """Peak of the sum over sum of the peaks: how far the components peak together (<= 1)."""
        return self.master_peak_bytes / self.component_sum


@dataclass(frozen=True, slots=True, kw_only=True)
class Baseline:
    """A paired measurement (same run, TQ off and on) and the configuration it ran at."""

    label: str
    config: CapacityConfig
    without_tq: PathMeasurement
    with_tq: PathMeasurement
    representation: str = "numpy"
    """How the TQ-off path holds logprobs and token ids (``numpy`` arrays or ``python-list``)."""
    notes: tuple[str, ...] = field(default=())


def _require(data: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a JSON object, got {type(data).__name__}")
    if key not in data:
        raise ConfigError(f"{where}.{key} is missing")
    return data[key]


def _bytes(value: Any, where: str, *, allow_zero: bool) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where} must be a number of bytes, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{where} must be {'>= 0' if allow_zero else 'positive'}, got {value!r}")
    return int(round(value))


def _path(data: Mapping[str, Any], name: str, components: tuple[str, ...], where: str) -> PathMeasurement:
    block = _require(data, name, where)
    where = f"{where}.{name}"
    peak = _bytes(_require(block, "master_peak_bytes", where), f"{where}.master_peak_bytes", allow_zero=False)
    raw = _require(block, "components", where)
    comps = {c: _bytes(_require(raw, c, f"{where}.components"), f"{where}.components.{c}", allow_zero=True)
             for c in components}
    total = sum(comps.values())
    # The peak of a sum never exceeds the sum of the peaks; a larger peak means the file
    # measured something its components do not account for.
    if peak > total:
        raise ConfigError(
            f"{where}.master_peak_bytes ({peak}) exceeds the sum of {where}.components ({total})"
        )
    return PathMeasurement(master_peak_bytes=peak, components=comps)


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{where} must be a positive integer, got {value!r}")
    return value


def _model(value: Any, where: str) -> ModelSpec:
    if isinstance(value, str):
        try:
            return get_model(value)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if isinstance(value, Mapping):
        dims = {k: _positive_int(_require(value, k, where), f"{where}.{k}")
                for k in ("num_layers", "topk", "num_experts")}
        try:
            return ModelSpec(name=str(value.get("name", "custom")), **dims)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    raise ConfigError(f"{where} must be a preset name or an object with num_layers, topk, num_experts")


def _config(data: Mapping[str, Any], where: str) -> tuple[CapacityConfig, str]:
    block = _require(data, "config", where)
    where = f"{where}.config"
    raw = {k: _require(block, k, where) for k in _CONFIG_KEYS}
    context = raw["context_length"]
    if isinstance(context, bool) or not isinstance(context, (int, str)):
        raise ConfigError(f"{where}.context_length must be a token count such as 65536 or \"64K\", got {context!r}")
    seg_tokens = block.get("mean_segment_tokens")
    mean_segments = raw["mean_segments"]
    if (isinstance(mean_segments, bool) or not isinstance(mean_segments, (int, float))
            or not 0 < mean_segments < math.inf):
        raise ConfigError(f"{where}.mean_segments must be a positive number, got {mean_segments!r}")
    representation = block.get("representation", "numpy")
    if representation not in REPRESENTATIONS:
        raise ConfigError(f"{where}.representation must be one of {', '.join(REPRESENTATIONS)}, got {representation!r}")
    model = _model(raw["model"], f"{where}.model")
    dtype = str(raw["routed_experts_dtype"])
    try:
        r3_dtype(dtype)
        check_dtype_holds_experts(model.num_experts, dtype)
    except ConfigError as exc:
        raise ConfigError(f"{where}.routed_experts_dtype: {exc}") from None
    try:
        config = CapacityConfig(
            model=model,
            context_length=parse_count(context, f"{where}.context_length"),
            rollout_batch_size=_positive_int(raw["rollout_batch_size"], f"{where}.rollout_batch_size"),
            n_samples_per_prompt=_positive_int(raw["n_samples_per_prompt"], f"{where}.n_samples_per_prompt"),
            nodes=_positive_int(raw["nodes"], f"{where}.nodes"),
            routed_experts_dtype=dtype,
            mean_segments=float(mean_segments),
            mean_segment_tokens=None if seg_tokens is None else parse_count(seg_tokens, f"{where}.mean_segment_tokens"),
        )
    except ConfigError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith(where) else f"{where}: {msg}") from None
    return config, representation


def baseline_from_dict(data: Mapping[str, Any], source: str = "baseline") -> Baseline:
    """Validate a baseline in the memory benchmark's JSON schema (sizes in bytes)."""
    config, representation = _config(data, source)
    return Baseline(
        label=str(data.get("label", source)) if isinstance(data, Mapping) else source,
        config=config,
        without_tq=_path(data, "without_tq", WITHOUT_TQ_COMPONENTS, source),
        with_tq=_path(data, "with_tq", WITH_TQ_COMPONENTS, source),
        representation=representation,
    )


def load_baseline(path: str | Path) -> Baseline:
    """Read ``--baseline FILE``; any problem is a ConfigError naming the file or the key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--baseline: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--baseline: {str(path)!r} is not valid JSON: {exc}") from None
    baseline = baseline_from_dict(data, source="baseline")
    if "label" not in data:
        baseline = replace(baseline, label=f"measured: {path.name}")
    return baseline


def baseline_to_dict(baseline: Baseline) -> dict[str, Any]:
    """The baseline in the same schema :func:`baseline_from_dict` reads (round-trips)."""
    c = baseline.config
    out: dict[str, Any] = {"label": baseline.label}
    for name in ("without_tq", "with_tq"):
        m: PathMeasurement = getattr(baseline, name)
        out[name] = {"master_peak_bytes": m.master_peak_bytes, "components": dict(m.components)}
    out["config"] = {
        "model": {"name": c.model.name, "num_layers": c.model.num_layers, "topk": c.model.topk,
                  "num_experts": c.model.num_experts},
        "context_length": c.context_length,
        "rollout_batch_size": c.rollout_batch_size,
        "n_samples_per_prompt": c.n_samples_per_prompt,
        "nodes": c.nodes,
        "routed_experts_dtype": c.routed_experts_dtype,
        "mean_segments": c.mean_segments,
        "representation": baseline.representation,
    }
    if c.mean_segment_tokens is not None:
        out["config"]["mean_segment_tokens"] = c.mean_segment_tokens
    if baseline.notes:
        out["notes"] = list(baseline.notes)
    return out


def _gib(x: float) -> int:
    return int(round(x * _GIB))


SEED_QWEN_BASELINE = Baseline(
    label="seed (published figures): Qwen3.6-35B-A3B, 64K, 512 x 8, 2 nodes",
    config=CapacityConfig(
        model=get_model("qwen3.6-35b-a3b"),
        context_length=64 * 1024,
        rollout_batch_size=512,
        n_samples_per_prompt=8,
        nodes=2,
        routed_experts_dtype="int32",
        mean_segments=1.0,
    ),
    without_tq=PathMeasurement(
        master_peak_bytes=_gib(757),
        components={"proxy": _gib(80.8), "rollout_manager": _gib(591.7), "object_store": _gib(202.5)},
    ),
    with_tq=PathMeasurement(
        master_peak_bytes=_gib(247),
        components={"proxy": _gib(28.6), "rollout_manager": _gib(18.7), "object_store": _gib(1.4),
                    "tq_controller": 0, "tq_storage_unit_master": _gib(215.1)},
    ),
    representation="python-list",
    notes=(
        "component peaks and master peaks are the seed's published PSS figures (GiB)",
        "the seed does not publish the TQ Controller separately: counted as 0 here",
        "the seed does not publish Segments per trajectory: mean_segments = 1 (full-length) is assumed",
        "the TQ-off path is taken to hold logprobs and token ids as Python lists (the seed's field table)",
    ),
)
