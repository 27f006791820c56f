"""One row per Segment, for export: the trained values of a Sample with the session's tree facts beside them.

R3 is written as compact ids (the narrowest unsigned dtype that holds them) with its shape and dtype,
so a reader restores int32 ``[T-1, layers, top-k]`` exactly; messages (the conversation of the Segment's
last step: what the agent sent and the assistant message it got), tools and metadata as JSON text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from dressage.trajectory.sample import Sample

__all__ = ["ExportedSession", "segment_rows", "conversation", "compact_r3", "ROW_FIELDS"]

ROW_FIELDS = ("session_id", "segment_index", "group_index", "index", "branch_from", "boundary_reason", "step_ids",
              "reward", "tokens", "prompt_length", "response_length", "loss_mask", "token_versions",
              "rollout_log_probs", "r3_ids", "r3_dtype", "r3_shape", "messages", "tools", "metadata",
              "large_field_refs")


@dataclass(slots=True)
class ExportedSession:
    """A finalized session to export: its Samples (restored, or with refs still attached) and its
    session document (:func:`dressage.trajectory.view.session_document`)."""

    session_id: str
    samples: list[Sample]
    document: dict[str, Any]
    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def compact_r3(ids: np.ndarray) -> tuple[bytes, str, list[int]]:
    """R3 ids as bytes in the narrowest of uint8 / uint16 / int32 that holds them, its dtype and shape."""
    ids = np.asarray(ids)
    top = int(ids.max()) if ids.size else 0
    low = int(ids.min()) if ids.size else 0
    dtype = np.uint8 if 0 <= low and top < 256 else np.uint16 if 0 <= low and top < 65536 else np.int32
    return np.ascontiguousarray(ids, dtype=dtype).tobytes(), np.dtype(dtype).name, [int(n) for n in ids.shape]


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), default=str)


def conversation(step: Mapping[str, Any] | None) -> list[Any] | None:
    """A step document's conversation: the messages the agent sent, then the assistant message it got
    (``None`` when the step holds neither)."""
    if step is None:
        return None
    sent, reply = step.get("messages"), step.get("assistant_message")
    if sent is None and reply is None:
        return None
    return [*(sent or ()), *(() if reply is None else (reply,))]


def segment_rows(sessions: Sequence[ExportedSession]) -> list[dict[str, Any]]:
    """The rows of every Segment, session by session in Segment order."""
    rows = []
    for ex in sessions:
        steps = {s["step_id"]: s for s in ex.document.get("steps", ())}
        segs = {s["index"]: s for s in ex.document.get("segments", ())}
        for sample in ex.samples:
            seg = segs.get(sample.segment_index, {})
            step_ids = [int(i) for i in sample.metadata.get("step_ids", seg.get("step_ids", ()))]
            last = steps.get(step_ids[-1]) if step_ids else None
            r3 = sample.rollout_routed_experts
            r3_ids, r3_dtype, r3_shape = compact_r3(r3) if r3 is not None else (None, None, None)
            refs = {name: {"rows": int(sum(p.rows for p in pieces)),
                           "keys": sorted({str(p.value.key) for p in pieces if hasattr(getattr(p, "value", None), "key")})}
                    for name, pieces in sample.remote.items()}
            meta = {k: v for k, v in sample.metadata.items() if k not in ("step_ids", "boundary_reason")}
            rows.append({
                "session_id": sample.session_id, "segment_index": int(sample.segment_index),
                "group_index": sample.group_index, "index": sample.index,
                "branch_from": seg.get("branch_from"), "boundary_reason": sample.metadata.get("boundary_reason"),
                "step_ids": step_ids, "reward": None if sample.reward is None else float(sample.reward),
                "tokens": np.asarray(sample.tokens, dtype=np.int32).tolist(),
                "prompt_length": int(sample.prompt_length), "response_length": int(sample.response_length),
                "loss_mask": np.asarray(sample.loss_mask, dtype=np.int32).tolist(),
                "token_versions": np.asarray(sample.token_versions, dtype=np.int64).tolist(),
                "rollout_log_probs": None if sample.rollout_log_probs is None else
                np.asarray(sample.rollout_log_probs, dtype=np.float32).tolist(),
                "r3_ids": r3_ids, "r3_dtype": r3_dtype, "r3_shape": r3_shape,
                "messages": _json(conversation(last)),
                "tools": _json(None if last is None else last.get("tools")),
                "metadata": _json(meta), "large_field_refs": _json(refs or None),
            })
    return rows
