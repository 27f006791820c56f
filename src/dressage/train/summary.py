"""What the consumer checks on a restored shard, and the hash of each Sample (trainer side)."""

from __future__ import annotations

from typing import Any

from dressage.train.checks import check_sample
from dressage.train.digest import sample_digest

__all__ = ["summarise_shard"]


def summarise_shard(samples: Any, model: Any) -> dict[str, Any]:
    """Check a restored shard and hash it: counts, restored large-field bytes, (order key, digest)s."""
    out: dict[str, Any] = {"segments": 0, "tokens": 0, "trained_tokens": 0, "large_field_bytes": {}, "digests": []}
    for s in samples:
        check_sample(s, num_layers=model.num_layers if s.rollout_routed_experts is not None else None,
                     topk=model.topk, num_experts=model.num_experts)
        out["segments"] += 1
        out["tokens"] += s.total_length
        out["trained_tokens"] += int(s.loss_mask.sum())
        for name, arr in (("logprobs", s.rollout_log_probs), ("routed_experts", s.rollout_routed_experts)):
            if arr is not None:
                out["large_field_bytes"][name] = out["large_field_bytes"].get(name, 0) + int(arr.nbytes)
        out["digests"].append((s.order_key, sample_digest(s)))
    return out
