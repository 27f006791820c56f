"""The trainer's R3 check: a forward pass with routing forced to the restored experts.

``replay_sample`` runs the model over a restored Sample's ``tokens`` with every MoE layer routed
to ``rollout_routed_experts`` (Rollout Routing Replay) and compares the log-probabilities of the
trained tokens with ``rollout_log_probs``. Without replay (``force=False``) the model routes on
its own, which is what changes once the trainer's weights differ from the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dressage.errors import FieldShapeError
from dressage.trajectory import Sample

__all__ = ["ReplayResult", "replay_sample", "replay_summary", "merge_replay"]


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """How the trainer's forward pass compares with what the rollout recorded."""

    tokens: int
    """Trained tokens compared (``loss_mask == 1``)."""
    identical_tokens: int
    """Of those, logprobs equal bit for bit (as float32)."""
    max_abs_diff: float
    sum_abs_diff: float
    """|sum of recomputed logprobs - sum of recorded ones| over the trained tokens (both as float32
    values, summed in float64): the whole-sequence log-probability the loss sees."""
    expert_mismatch: float
    """Share of (position, layer, slot) expert ids that differ from the restored ones."""

    @property
    def bit_identical(self) -> bool:
        return self.identical_tokens == self.tokens

    def to_dict(self) -> dict[str, float | int | bool]:
        return {"tokens": self.tokens, "identical_tokens": self.identical_tokens, "bit_identical": self.bit_identical,
                "max_abs_diff": self.max_abs_diff, "sum_abs_diff": self.sum_abs_diff,
                "expert_mismatch": self.expert_mismatch}


def replay_sample(model: "object", sample: Sample, *, force: bool = True) -> ReplayResult:
    """Score ``sample`` with ``model`` (a :class:`dressage.engine.moe.MoEModel`) and compare."""
    if sample.rollout_log_probs is None or sample.rollout_routed_experts is None:
        raise FieldShapeError(f"sample {sample.session_id}#{sample.segment_index}: logprobs and routed "
                              "experts must be restored before the replay check")
    experts = sample.rollout_routed_experts
    scores = model.score(sample.tokens, sample.prompt_length,  # type: ignore[attr-defined]
                         routed_experts=experts if force else None)
    mask = sample.loss_mask.astype(bool)
    ours = scores.logprobs[mask]
    recorded = sample.rollout_log_probs[mask]
    ours32 = ours.astype(np.float32)
    return ReplayResult(
        tokens=int(mask.sum()),
        identical_tokens=int(np.sum(ours32.view(np.uint32) == recorded.view(np.uint32))),
        max_abs_diff=float(np.max(np.abs(ours32.astype(np.float64) - recorded))) if mask.any() else 0.0,
        sum_abs_diff=float(abs(ours32.astype(np.float64).sum() - recorded.astype(np.float64).sum())),
        expert_mismatch=float(np.mean(scores.routed_experts != experts)) if experts.size else 0.0,
    )


def replay_summary(model: "object", samples: "list[Sample]") -> dict[str, float | int]:
    """:func:`replay_sample` over restored ``samples``, added up (``dressage run --engine transformers``)."""
    out: dict[str, float | int] = {"samples": 0, "tokens": 0, "identical_tokens": 0, "max_abs_diff": 0.0,
                                   "max_sum_abs_diff": 0.0}
    for s in samples:
        r = replay_sample(model, s)
        out["samples"] += 1
        out["tokens"] += r.tokens
        out["identical_tokens"] += r.identical_tokens
        out["max_abs_diff"] = max(float(out["max_abs_diff"]), r.max_abs_diff)
        out["max_sum_abs_diff"] = max(float(out["max_sum_abs_diff"]), r.sum_abs_diff)
    return out


def merge_replay(a: dict[str, float | int], b: dict[str, float | int]) -> dict[str, float | int]:
    """Two :func:`replay_summary` results as one."""
    if not a:
        return dict(b)
    return {"samples": a["samples"] + b["samples"], "tokens": a["tokens"] + b["tokens"],
            "identical_tokens": a["identical_tokens"] + b["identical_tokens"],
            "max_abs_diff": max(a["max_abs_diff"], b["max_abs_diff"]),
            "max_sum_abs_diff": max(a["max_sum_abs_diff"], b["max_sum_abs_diff"])}
