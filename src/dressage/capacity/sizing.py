"""Sizing by formula: S_R3 = sum over Segments of T x L x K x D, and what else one Segment holds.

Two representations of the ordinary fields are priced: our dense numpy arrays, and Python lists
(one pointer slot plus one boxed object per element) for comparison with the seed's field table.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass

from dressage.capacity.config import CapacityConfig
from dressage.errors import ConfigError
from dressage.fields.r3 import r3_itemsize
from dressage.fields.registry import FIELDS

__all__ = [
    "REPRESENTATIONS",
    "BatchSizing",
    "FieldShare",
    "size_batch",
    "per_token_bytes",
    "segment_breakdown",
    "r3_growth",
]

REPRESENTATIONS = ("numpy", "python-list")

# Sizes of this interpreter, not constants copied from somewhere: a list element is one pointer
# slot; a float or a token id (> 256, so never one of CPython's cached small ints) is its own object.
_SLOT = struct.calcsize("P")
_LIST_FLOAT = _SLOT + sys.getsizeof(0.5)
_LIST_TOKEN_ID = _SLOT + sys.getsizeof(100_000)
# loss_mask (0/1) and token versions repeat a handful of values, so every slot points at a
# shared int object: only the slot is paid per token.
_LIST_SHARED_INT = _SLOT

# Order of the breakdown, largest first as the seed's table lists them.
BREAKDOWN_FIELDS = ("routed_experts", "logprobs", "tokens", "messages", "loss_mask", "token_versions")


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSizing:
    """The R3 working set of one rollout batch."""

    trajectories: int
    segments: int
    segment_tokens: int
    tokens: int
    """Tokens over all Segments: segments x segment_tokens."""
    r3_bytes_per_segment: int
    r3_bytes: int
    """S_R3 over the batch, counting T rows per Segment as the seed's formula does."""
    r3_stored_bytes: int
    """What slime's ``[T-1, L, K]`` layout actually stores: one row fewer per Segment."""
    r3_bytes_per_storage_unit: float
    """R3 a single StorageUnit holds when the batch is spread evenly over ``nodes`` units."""


@dataclass(frozen=True, slots=True)
class FieldShare:
    name: str
    bytes: int
    share: float


def size_batch(config: CapacityConfig) -> BatchSizing:
    row = config.model.num_layers * config.model.topk * r3_itemsize(config.routed_experts_dtype)
    per_segment = config.segment_tokens * row
    total = per_segment * config.segments
    return BatchSizing(
        trajectories=config.trajectories,
        segments=config.segments,
        segment_tokens=config.segment_tokens,
        tokens=config.segments * config.segment_tokens,
        r3_bytes_per_segment=per_segment,
        r3_bytes=total,
        r3_stored_bytes=total - config.segments * row,
        r3_bytes_per_storage_unit=total / config.nodes,
    )


def r3_growth(target: CapacityConfig, baseline: CapacityConfig) -> float:
    """Cluster-wide R3 of ``target`` relative to ``baseline`` (context, layers, top-k, dtype, Segments)."""
    return size_batch(target).r3_bytes / size_batch(baseline).r3_bytes


def per_token_bytes(config: CapacityConfig, representation: str = "numpy") -> dict[str, float]:
    """Bytes per Segment token of each field in ``representation``.

    Every token is priced as a response token (agentic Segments are almost all response:
    tool observations count too, with loss mask 0), so logprobs, masks and versions cover T.
    R3 is a dense array in both representations, as the seed's int32 sizing assumes.
    """
    if representation not in REPRESENTATIONS:
        raise ConfigError(f"representation must be one of {', '.join(REPRESENTATIONS)}, got {representation!r}")
    r3 = float(config.model.num_layers * config.model.topk * r3_itemsize(config.routed_experts_dtype))
    if representation == "numpy":
        ordinary = {name: float(FIELDS[name].dtype.itemsize)
                    for name in ("logprobs", "tokens", "loss_mask", "token_versions")}
    else:
        ordinary = {
            "logprobs": float(_LIST_FLOAT),
            "tokens": float(_LIST_TOKEN_ID),
            "loss_mask": float(_LIST_SHARED_INT),
            "token_versions": float(_LIST_SHARED_INT),
        }
    costs = {"routed_experts": r3, **ordinary, "messages": float(config.message_bytes_per_token)}
    return {name: costs[name] for name in BREAKDOWN_FIELDS}


def segment_breakdown(config: CapacityConfig, representation: str = "numpy") -> list[FieldShare]:
    """Bytes and share of each field in one average Segment, largest first."""
    costs = per_token_bytes(config, representation)
    sizes = {name: round(cost * config.segment_tokens) for name, cost in costs.items()}
    total = sum(sizes.values())
    return [FieldShare(name, size, size / total) for name, size in sizes.items()]
