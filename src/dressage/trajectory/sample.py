"""Sample: what the trainer consumes, with slime's field names.

Large fields held by reference stay in ``remote`` (ordered pieces) until the training reader
restores them after data-parallel sharding; resident fields are materialised at conversion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dressage.trajectory.pieces import Fill, Piece
from dressage.trajectory.segment import Segment

__all__ = ["Sample", "SAMPLE_LARGE_FIELDS", "samples_of_session", "VERSION_LABELS_KEY"]

VERSION_LABELS_KEY = "weight_version_labels"
"""Sample metadata key: ``{str(code): engine string}`` of the named weight versions its tokens carry."""

# Segment large-field name -> slime Sample attribute.
SAMPLE_LARGE_FIELDS = {"logprobs": "rollout_log_probs", "routed_experts": "rollout_routed_experts"}


@dataclass(slots=True, eq=False, kw_only=True)
class Sample:
    """One training sample.

    ``tokens`` = prompt + response (int32); ``loss_mask``, ``rollout_log_probs`` and
    ``token_versions`` cover the ``response_length`` response tokens; ``rollout_routed_experts``
    is int32 ``[len(tokens) - 1, num_layers, topk]``.
    """

    tokens: np.ndarray
    response_length: int
    loss_mask: np.ndarray
    token_versions: np.ndarray
    rollout_log_probs: np.ndarray | None = None
    rollout_routed_experts: np.ndarray | None = None
    reward: float | None = None
    session_id: str = ""
    segment_index: int = 0
    group_index: int | None = None
    index: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    remote: dict[str, tuple[Piece | Fill, ...]] = field(default_factory=dict)
    """Large fields still behind references, by Segment field name."""
    r3_trailing: tuple[int, ...] = ()

    @classmethod
    def from_segment(cls, seg: Segment, *, reward: float | None = None, group_index: int | None = None,
                     index: int | None = None, metadata: dict[str, Any] | None = None) -> "Sample":
        sample = cls(
            tokens=seg.tokens, response_length=seg.response_length, loss_mask=seg.loss_mask,
            token_versions=seg.token_versions, reward=reward, session_id=seg.session_id,
            segment_index=seg.index, group_index=group_index, index=index,
            metadata={"boundary_reason": seg.boundary_reason, "step_ids": list(seg.step_ids),
                      "version_span": seg.version_span(), **(metadata or {})},
            r3_trailing=seg.r3_trailing,
        )
        for name, attr in SAMPLE_LARGE_FIELDS.items():
            if name not in seg.large:
                continue
            if seg.is_resident(name):
                setattr(sample, attr, seg.materialize(name))
            else:
                sample.remote[name] = seg.large[name]
        return sample

    @property
    def total_length(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def prompt_length(self) -> int:
        return self.total_length - self.response_length

    @property
    def weight_versions(self) -> list[str]:
        """Distinct policy versions of the trained tokens, in order of first use (slime's field).

        Each as the engine reported it: a named version's string as sent (from the metadata's
        ``weight_version_labels``), a numeric one as its number."""
        trained = self.token_versions[self.loss_mask.astype(bool)]
        _, first = np.unique(trained, return_index=True)
        labels = self.metadata.get(VERSION_LABELS_KEY) or {}
        return [labels.get(str(int(trained[i])), str(int(trained[i]))) for i in sorted(first)]

    @property
    def order_key(self) -> tuple[int, int, str, int]:
        """A batch order independent of which session finished first (group, sample, session, segment)."""
        g = -1 if self.group_index is None else int(self.group_index)
        return (g, int(self.metadata.get("sample_index", -1)), self.session_id if g < 0 else "", self.segment_index)

    @property
    def is_restored(self) -> bool:
        return not self.remote

    def field_arrays(self) -> dict[str, np.ndarray]:
        """Every array field, for comparison and digests (restored fields only)."""
        out = {"tokens": self.tokens, "loss_mask": self.loss_mask, "token_versions": self.token_versions}
        if self.rollout_log_probs is not None:
            out["rollout_log_probs"] = self.rollout_log_probs
        if self.rollout_routed_experts is not None:
            out["rollout_routed_experts"] = self.rollout_routed_experts
        return out


def samples_of_session(segments: Any, *, reward: float | None, metadata: dict[str, Any]) -> list[Sample]:
    """A finalized session's Segments as Samples: each gets the session's reward, its prompt group
    (``metadata["group_index"]``) and the rest of its metadata."""
    meta = dict(metadata)
    group = meta.pop("group_index", None)
    return [Sample.from_segment(seg, reward=reward, group_index=group, metadata=meta) for seg in segments]
