"""The seed's data-plane flags, shared by ``dressage run`` and ``dressage proxy serve``."""

from __future__ import annotations

import argparse

from dressage.fields import MODEL_PRESETS, R3_DTYPES, TRANSFERABLE_FIELDS, get_model
from dressage.proxy.config import DataPlaneConfig

__all__ = ["add_data_plane_args", "data_plane_config", "transfer_queue_config"]


def add_data_plane_args(p: argparse.ArgumentParser, *, default_model: str = "qwen3.6-35b-a3b") -> None:
    g = p.add_argument_group("data plane (the seed's flags)")
    g.add_argument("--model", default=default_model, metavar="PRESET",
                   help=f"model shape preset: {', '.join(MODEL_PRESETS)} (default: {default_model})")
    g.add_argument("--use-rollout-routing-replay", action="store_true",
                   help="record R3 routed experts for every token (needs an engine started with "
                        "--enable-return-routed-experts)")
    g.add_argument("--enable-transfer-queue", action="store_true",
                   help="write large fields to TransferQueue StorageUnits; only references travel")
    g.add_argument("--transfer-queue-config", metavar="FILE", default=None,
                   help="TransferQueue YAML (deployment, units, budgets); default: embedded")
    g.add_argument("--transfer-params", nargs="+", choices=TRANSFERABLE_FIELDS, default=None, metavar="FIELD",
                   help="fields to offload: logprobs routed_experts (default: every recorded large field)")
    g.add_argument("--routed-experts-dtype", choices=tuple(R3_DTYPES), default="int32",
                   help="storage dtype of R3 expert ids; restored to int32 for training (default: int32)")
    g.add_argument("--segment-view", choices=("lineage", "timeline"), default="lineage",
                   help="how Segments are built at finalize (default: lineage)")
    g.add_argument("--drop-retry-orphans", action="store_true",
                   help="drop childless siblings of retried calls before building Segments")
    g.add_argument("--shared-prefix-loss", choices=("once", "every"), default="once",
                   help="once: every generated token is trained in exactly one Segment; every: each "
                        "lineage Segment trains turns it shares with other branches too (default: once)")


def data_plane_config(args: argparse.Namespace) -> DataPlaneConfig:
    return DataPlaneConfig(
        model=get_model(args.model), use_rollout_routing_replay=args.use_rollout_routing_replay,
        enable_transfer_queue=args.enable_transfer_queue, transfer_queue_config=args.transfer_queue_config,
        transfer_params=tuple(args.transfer_params) if args.transfer_params else None,
        routed_experts_dtype=args.routed_experts_dtype, segment_view=args.segment_view,
        drop_retry_orphans=args.drop_retry_orphans, shared_prefix_loss=args.shared_prefix_loss)


def transfer_queue_config(args: argparse.Namespace):
    """The TQ config the flags select (``None`` when TQ is off)."""
    if not args.enable_transfer_queue:
        return None
    from dressage.tq import load_config

    return load_config(args.transfer_queue_config)
