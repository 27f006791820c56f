"""The consumer's checks: every restored Sample must look exactly like slime expects."""

from __future__ import annotations

import numpy as np

from dressage.errors import FieldShapeError
from dressage.trajectory import Sample

__all__ = ["check_sample"]


def check_sample(s: Sample, *, num_layers: int | None = None, topk: int | None = None,
                 num_experts: int | None = None) -> None:
    """Raise FieldShapeError naming the first broken invariant of a restored Sample."""
    def fail(msg: str) -> None:
        raise FieldShapeError(f"sample {s.session_id}#{s.segment_index}: {msg}")

    T, R = s.total_length, s.response_length
    if s.remote:
        fail(f"fields still behind references: {sorted(s.remote)}")
    if s.tokens.dtype != np.int32 or s.tokens.ndim != 1:
        fail(f"tokens must be int32 [T], got {s.tokens.dtype}{list(s.tokens.shape)}")
    if not 0 < R < T:
        fail(f"response_length {R} outside (0, {T})")
    if s.loss_mask.shape != (R,) or s.token_versions.shape != (R,):
        fail(f"loss_mask {s.loss_mask.shape} / token_versions {s.token_versions.shape} != ({R},)")
    lp = s.rollout_log_probs
    if lp is not None:
        if lp.dtype != np.float32 or lp.shape != (R,):
            fail(f"rollout_log_probs must be float32 [{R}], got {lp.dtype}{list(lp.shape)}")
        if np.any(lp[s.loss_mask == 0] != 0.0):
            fail("rollout_log_probs nonzero on environment tokens")
        if not np.all(np.isfinite(lp)) or np.any(lp > 0):
            fail("rollout_log_probs must be finite and <= 0")
    re = s.rollout_routed_experts
    if re is not None:
        want = (T - 1, num_layers, topk) if num_layers is not None else (T - 1, *re.shape[1:])
        if re.dtype != np.int32 or re.shape != want:
            fail(f"rollout_routed_experts must be int32 {list(want)}, got {re.dtype}{list(re.shape)}")
        if num_experts is not None and re.size and (re.min() < 0 or re.max() >= num_experts):
            fail(f"expert ids outside [0, {num_experts})")
