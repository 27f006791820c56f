"""A session as one JSON-friendly document: its step tree and its Segments, for people to look at.

The session viewer and the exporters read this one shape. Steps carry lineage, branches, boundaries
and, while the session holds them (a finalized one, for the steps that end a Segment), the messages
the agent sent, the assistant message answered and the tools; Segments carry tokens, loss mask,
versions and, when resident, response logprobs. Large fields behind references appear as sizes.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from dressage.trajectory.segment import Segment
from dressage.trajectory.session import Session
from dressage.trajectory.step import StepRecord

__all__ = ["session_document", "segment_document", "step_document", "TokenText"]


class TokenText:
    """Each token id's text as ``decode([id])`` gives it, remembered per id: a page that polls a long
    session decodes each distinct id once (at most the vocabulary)."""

    def __init__(self, decode: Callable[[list[int]], Any] | None) -> None:
        self._decode = decode
        self._known: dict[int, str | None] = {}

    def __call__(self, token_id: int) -> str | None:
        if token_id not in self._known:
            try:
                text = None if self._decode is None else str(self._decode([token_id]))
            except Exception:  # a tokenizer's own error on one id only costs that token its text
                text = None
            self._known[token_id] = text
        return self._known[token_id]


def step_document(step: StepRecord, *, retry_orphan: bool = False) -> dict[str, Any]:
    """One step of the tree: where it hangs, why it starts a lineage, what the agent sent and what it got
    (``assistant_message``: the reply as the chat endpoints answered it, tool calls included)."""
    return {"step_id": step.step_id, "parent_id": step.parent_id, "lineage_id": step.lineage_id,
            "branch_from": step.branch_from,
            "boundary": None if step.boundary is None else step.boundary.to_dict(),
            "prompt_length": step.prompt_len, "response_length": step.response_len,
            "retry_orphan": bool(retry_orphan),
            "versions": sorted({int(v) for v in np.unique(step.token_versions)}) if step.token_versions.size else [],
            "messages": step.messages, "tools": step.tools,
            "assistant_message": step.metadata.get("assistant_message") if isinstance(step.metadata, dict) else None}


def segment_document(seg: Segment, token_text: Callable[[int], str | None] | None = None) -> dict[str, Any]:
    """One Segment with every token-level value (logprobs only when resident in the Proxy);
    ``token_text(id)`` adds each token's text (``token_text``)."""
    out = seg.to_summary()
    if token_text is not None:
        out["token_text"] = [token_text(int(t)) for t in seg.tokens]
    out["token_versions"] = seg.token_versions.tolist()
    out["trained_tokens"] = int(np.count_nonzero(seg.loss_mask))
    logprobs = seg.materialize("logprobs") if seg.is_resident("logprobs") else None
    # JSON has no -inf: a logprob the engine gave as -inf is shown as missing.
    out["logprobs"] = None if logprobs is None else \
        [float(x) if np.isfinite(x) else None for x in np.asarray(logprobs, dtype=np.float32)]
    return out


def session_document(session: Session, segments: Sequence[Segment] | None = None, *,
                     reward: float | None = None,
                     token_text: Callable[[int], str | None] | None = None) -> dict[str, Any]:
    """``session`` with its steps in call order and ``segments`` (none yet while it is active)."""
    orphans = session.retry_orphans() if session.steps else set()
    segs = list(segments or ())
    return {"session_id": session.session_id, "state": session.state,
            "reward": session.reward if reward is None else reward, "metadata": dict(session.metadata),
            "steps": [step_document(session.steps[i], retry_orphan=i in orphans) for i in sorted(session.steps)],
            "segments": [segment_document(s, token_text) for s in segs],
            "trained_tokens": sum(int(np.count_nonzero(s.loss_mask)) for s in segs)}
