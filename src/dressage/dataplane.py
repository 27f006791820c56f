"""DataPlaneConfig: what is recorded and which large fields leave the centralised path.

Shared by the Proxy, ``dressage run`` and the benchmarks; its fields generate the seed's flags
(``--use-rollout-routing-replay``, ``--enable-transfer-queue``, ``--transfer-params logprobs
routed_experts``, ``--routed-experts-dtype {uint8,uint16,int32}``) as the ``data_plane`` section of a
command's config tree (:mod:`dressage.flags`); which TransferQueue is
:class:`dressage.tq.config.TransferQueueSelection`'s concern. Validated once, in ``__post_init__``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dressage.errors import ConfigError, UnknownFieldError
from dressage.fields import (DEFAULT_R3_DTYPE, R3_DTYPES, TRANSFERABLE_FIELDS, ModelSpec,
                             check_dtype_holds_experts, get_model)
from dressage.fields.config import DEFAULT_MODEL
from dressage.fields.r3 import r3_dtype
from dressage.fields.registry import check_field_names
from dressage.flags import flag
from dressage.trajectory.segment import SHARED_PREFIX_LOSS


__all__ = ["DataPlaneConfig"]


@dataclass(kw_only=True, slots=True)
class DataPlaneConfig:
    """What the Proxy records and which large fields leave the centralised path."""

    model: ModelSpec = field(default_factory=lambda: get_model(DEFAULT_MODEL),
                             metadata=flag(metavar="PRESET", default_text=DEFAULT_MODEL))
    """Model shape preset (see ``dressage.fields.MODEL_PRESETS``): recorded MoE layers, top-k and expert count."""
    use_rollout_routing_replay: bool = False
    """Record routed experts (R3) for every token that went through the model."""
    enable_transfer_queue: bool = False
    """Write the fields in ``transfer_params`` to TransferQueue StorageUnits; only refs travel."""
    transfer_params: tuple[str, ...] | None = field(
        default=None, metadata=flag(choices=TRANSFERABLE_FIELDS, metavar="FIELD"))
    """Fields to offload when TQ is on; ``None``: every recorded large field."""
    routed_experts_dtype: str = field(default=DEFAULT_R3_DTYPE, metadata=flag(choices=tuple(R3_DTYPES)))
    """Storage dtype of expert ids (``uint8``/``uint16``/``int32``); restored to int32 for training."""
    segment_view: str = field(default="lineage", metadata=flag(choices=("lineage", "timeline")))
    """How Segments are built at finalize: ``lineage`` (root-to-leaf chains) or ``timeline``."""
    drop_retry_orphans: bool = False
    """Drop childless siblings of retried calls before building Segments."""
    shared_prefix_loss: str = field(default="once", metadata=flag(choices=SHARED_PREFIX_LOSS))
    """``once``: each generated token has loss mask 1 in exactly one Segment (turns shared by
    branches are context elsewhere); ``every``: each lineage Segment trains its whole chain (tree RL)."""

    def __post_init__(self) -> None:
        if isinstance(self.model, str):
            self.model = get_model(self.model)
        elif isinstance(self.model, Mapping):  # a YAML tree holds the shape itself
            self.model = ModelSpec(**self.model)
        r3_dtype(self.routed_experts_dtype)
        if self.use_rollout_routing_replay:
            check_dtype_holds_experts(self.model.num_experts, self.routed_experts_dtype)
        if self.shared_prefix_loss not in SHARED_PREFIX_LOSS:
            raise ConfigError(f"shared_prefix_loss: expected 'once' or 'every', got {self.shared_prefix_loss!r}")
        if self.segment_view not in ("lineage", "timeline"):
            raise ConfigError(f"segment_view: expected 'lineage' or 'timeline', got {self.segment_view!r}")
        if self.transfer_params is not None:
            try:
                self.transfer_params = check_field_names(self.transfer_params, allowed=TRANSFERABLE_FIELDS)
            except UnknownFieldError as exc:
                raise ConfigError(f"--transfer-params: {exc}") from None
            if not self.enable_transfer_queue:
                raise ConfigError("--transfer-params needs --enable-transfer-queue")
            if "routed_experts" in self.transfer_params and not self.use_rollout_routing_replay:
                raise ConfigError(
                    "--transfer-params routed_experts needs Rollout Routing Replay: add --use-rollout-routing-replay"
                )

    @property
    def offloaded(self) -> tuple[str, ...]:
        """Fields written to TQ (empty when TQ is off)."""
        if not self.enable_transfer_queue:
            return ()
        if self.transfer_params is not None:
            return self.transfer_params
        return ("logprobs", "routed_experts") if self.use_rollout_routing_replay else ("logprobs",)

    @property
    def r3_shape(self) -> tuple[int, int] | None:
        return (self.model.num_layers, self.model.topk) if self.use_rollout_routing_replay else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.name, "use_rollout_routing_replay": self.use_rollout_routing_replay,
            "enable_transfer_queue": self.enable_transfer_queue,
            "transfer_params": list(self.offloaded), "routed_experts_dtype": self.routed_experts_dtype,
            "segment_view": self.segment_view, "drop_retry_orphans": self.drop_retry_orphans,
            "shared_prefix_loss": self.shared_prefix_loss,
        }
