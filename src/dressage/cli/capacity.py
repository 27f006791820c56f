"""``dressage capacity``: will this rollout batch fit on the master node, and from which batch size not.

Flags are turned into a :class:`~dressage.capacity.CapacityConfig` here; the library never sees them.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace

from dressage.capacity import (
    SEED_QWEN_BASELINE,
    CapacityConfig,
    capacity_report,
    distribution_mean,
    load_baseline,
    parse_segments_distribution,
    plot_projection,
    render_text,
)
from dressage.errors import ConfigError
from dressage.fields.models import MODEL_PRESETS, ModelSpec, get_model
from dressage.fields.r3 import DEFAULT_R3_DTYPE, R3_DTYPES
from dressage.units import parse_bytes, parse_count

_SHAPE_FLAGS = ("num_layers", "topk", "num_experts")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capacity",
        help="size R3 and project the master-node data-plane peak with and without TQ",
        description="Size R3 and the trajectory fields of a rollout batch, and project the master-node "
                    "peak with and without TQ from a measured baseline (built in: the seed's published "
                    "Qwen3.6-35B-A3B figures).",
    )
    m = p.add_argument_group("model")
    m.add_argument("--model", metavar="NAME", help=f"preset: {', '.join(MODEL_PRESETS)}")
    m.add_argument("--num-layers", metavar="N", help="recorded MoE layers (overrides the preset)")
    m.add_argument("--topk", metavar="K", help="experts routed per token per layer (overrides the preset)")
    m.add_argument("--num-experts", metavar="N", help="routed experts per layer (overrides the preset)")
    b = p.add_argument_group("batch")
    b.add_argument("--context-length", metavar="TOKENS", required=True,
                   help="context window in tokens: 65536, 64K, 256K")
    b.add_argument("--rollout-batch-size", metavar="N", required=True, help="prompts per rollout batch")
    b.add_argument("--n-samples-per-prompt", metavar="N", default="1", help="trajectories per prompt (default 1)")
    seg = b.add_mutually_exclusive_group()
    seg.add_argument("--mean-segments", metavar="X",
                     help="average Segments per trajectory, the seed's X-bar (default 1)")
    seg.add_argument("--segments-distribution", metavar="X:W,...",
                     help="Segments per trajectory with weights, e.g. 1:0.6,2:0.3,3:0.1")
    b.add_argument("--mean-segment-tokens", metavar="TOKENS",
                   help="average tokens per Segment (default: the full context)")
    b.add_argument("--message-bytes-per-token", metavar="BYTES",
                   help="chat-message bytes per Segment token (default 32)")
    s = p.add_argument_group("storage")
    s.add_argument("--routed-experts-dtype", metavar="DTYPE", default=DEFAULT_R3_DTYPE,
                   help=f"{' | '.join(R3_DTYPES)} (default int32)")
    s.add_argument("--nodes", metavar="N", default="1", help="TQ StorageUnits, one per node (default 1)")
    s.add_argument("--host-memory", metavar="SIZE", help="master-node host memory: 2TB, 1.82TiB")
    s.add_argument("--baseline", metavar="FILE",
                   help="measured per-component peaks (memory benchmark JSON); default: the seed's figures")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print JSON instead of text")
    o.add_argument("--plot", metavar="FILE", help="write a PNG of projected peak against batch size")
    p.set_defaults(func=_run)


def _int(args: argparse.Namespace, key: str) -> int:
    text = getattr(args, key)
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ConfigError(f"--{key.replace('_', '-')}: expected a whole number, got {text!r}") from None
    if not math.isfinite(value) or value != int(value):
        raise ConfigError(f"--{key.replace('_', '-')}: expected a whole number, got {text!r}")
    return int(value)


def _float(args: argparse.Namespace, key: str) -> float:
    text = getattr(args, key)
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ConfigError(f"--{key.replace('_', '-')}: expected a number, got {text!r}") from None


def _model(args: argparse.Namespace) -> ModelSpec:
    overrides = {k: _int(args, k) for k in _SHAPE_FLAGS if getattr(args, k) is not None}
    for key, value in overrides.items():
        if value <= 0:
            raise ConfigError(f"--{key.replace('_', '-')} must be a positive integer, got {value}")
    if args.model:
        base = get_model(args.model)
        if not overrides:
            return base
        try:
            return replace(base, name=f"{base.name} (modified)", **overrides)
        except ConfigError as exc:
            raise ConfigError(f"--model with overrides: {exc}") from None
    missing = [k for k in _SHAPE_FLAGS if k not in overrides]
    if missing:
        raise ConfigError(
            "--model or all of --num-layers, --topk, --num-experts is required (missing: "
            + ", ".join("--" + k.replace("_", "-") for k in missing) + ")"
        )
    try:
        return ModelSpec(name="custom", **overrides)
    except ConfigError as exc:
        raise ConfigError(f"--topk / --num-experts: {exc}") from None


def config_from_args(args: argparse.Namespace) -> CapacityConfig:
    """The edge: flags -> validated config."""
    if args.segments_distribution is not None:
        mean_segments = distribution_mean(parse_segments_distribution(args.segments_distribution))
    elif args.mean_segments is not None:
        mean_segments = _float(args, "mean_segments")
    else:
        mean_segments = 1.0
    extra = {}
    if args.message_bytes_per_token is not None:
        extra["message_bytes_per_token"] = _float(args, "message_bytes_per_token")
    return CapacityConfig(
        model=_model(args),
        context_length=parse_count(args.context_length, "--context-length"),
        rollout_batch_size=_int(args, "rollout_batch_size"),
        n_samples_per_prompt=_int(args, "n_samples_per_prompt"),
        mean_segments=mean_segments,
        mean_segment_tokens=(None if args.mean_segment_tokens is None
                             else parse_count(args.mean_segment_tokens, "--mean-segment-tokens")),
        routed_experts_dtype=args.routed_experts_dtype,
        nodes=_int(args, "nodes"),
        host_memory_bytes=None if args.host_memory is None else parse_bytes(args.host_memory, "--host-memory"),
        **extra,
    )


def _run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    baseline = SEED_QWEN_BASELINE if args.baseline is None else load_baseline(args.baseline)
    report = capacity_report(config, baseline)
    if args.plot:
        report["plot"] = str(plot_projection(config, baseline, args.plot))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_text(report))
        if args.plot:
            print(f"\nplot written to {report['plot']}")
    return 0
