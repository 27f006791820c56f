"""``POST /trajectory/read`` as a use case: which finalized trajectories a read selects, and its answer.

Two modes, as upstream's clients expect them:

- ``trajectory``: ``trajectory_id`` / ``session_id`` / ``session_ids`` name the trajectories;
  exactly those are read (``instance_id`` only filters them). ``data`` is their Segments.
- ``batch``: nothing named; finalized trajectories are read in whole prompt-instance groups
  (``instance_id``), oldest group first, at most ``max_groups`` groups. ``data`` is one list of
  Segments per group. A group is handed over once ``min_group_size`` of its sessions finalized, or
  once its oldest finalized session is ``group_timeout_s`` old (then flagged in
  ``meta_info.timed_out_groups``); the others wait, listed in ``meta_info.incomplete_groups``.

The answer is upstream's envelope (``success``, ``mode``, ``data``, ``meta_info``, ``drained``)
plus ``trajectories`` (our per-session view, kept as an alias of the same read). Each Segment object
carries upstream's fields (``tokens``, ``full_loss_mask``, ``full_logprobs``, ``full_versions``,
``routed_experts_chunks``, ``extra_info.finalization_id``) beside our summary, so upstream's rollout
consumer expands it into the same slime Sample as our ``format: samples``.
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from dressage.errors import ConfigError

__all__ = ["ReadSelection", "GroupRule", "SegmentFormat", "select_trajectories", "read_answer", "unknown_read_answer", "group_key",
           "finalization_id", "upstream_segment_fields"]

# Fixed namespace of finalization ids: the same finalize of the same session always names the same id.
_FINALIZATION_NS = uuid.UUID("6f1c2b7e-4d0a-5e8b-9c3f-2a1d0e9b8c7a")
# Token version of a context token in upstream's ``full_versions`` (its readers treat "-1" as "no policy").
_CONTEXT_VERSION = "-1"


@dataclass(slots=True)
class ReadSelection:
    mode: str
    """``trajectory`` or ``batch``."""
    groups: list[list[str]]
    """Session ids, one list per prompt-instance group (one list in trajectory mode)."""
    missing: list[str]
    """Named trajectories that are not finalized (unknown, active, aborted or already drained)."""
    incomplete: list[dict[str, Any]] = field(default_factory=list)
    """Groups a batch read held back: ``key``, ``finalized`` (sessions so far), ``age_s`` (of the oldest)."""
    timed_out: list[str] = field(default_factory=list)
    """Keys of the groups a batch read hands over short of ``min_group_size`` (their time-out passed)."""

    @property
    def session_ids(self) -> list[str]:
        return [sid for g in self.groups for sid in g]


def group_key(done: Any) -> str:
    """The prompt-instance group a finalized session belongs to (its own id when it has none)."""
    meta = getattr(done, "metadata", {}) or {}
    inst = meta.get("instance_id")
    if inst is None and meta.get("group_index") is not None:
        inst = meta.get("group_index")
    return str(inst) if inst is not None else f"session:{done.session_id}"


@dataclass(frozen=True, slots=True)
class GroupRule:
    """When a batch read hands a prompt group over: ``min_size`` finalized sessions, or the oldest
    of them ``timeout_s`` old (the rest of the group is taken as lost)."""

    min_size: int = 1
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.min_size, bool) or not isinstance(self.min_size, int) or self.min_size < 1:
            raise ConfigError(f"min_group_size must be a positive integer, got {self.min_size!r}")
        if self.timeout_s is not None and (isinstance(self.timeout_s, bool)
                                           or not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0):
            raise ConfigError(f"group_timeout_s must be positive, got {self.timeout_s!r}")

    def ready(self, size: int, age_s: float) -> bool:
        return size >= self.min_size or (self.timeout_s is not None and age_s >= self.timeout_s)


def select_trajectories(finalized: Mapping[str, Any], *, trajectory_id: str | None = None,
                        session_id: str | None = None, session_ids: Sequence[str] | None = None,
                        instance_id: str | None = None, max_groups: int | None = None,
                        groups_rule: GroupRule | None = None, now: float | None = None) -> ReadSelection:
    """What a read returns; ``finalized`` maps session id -> FinalizedSession in finalize order.

    ``groups_rule`` applies to batch reads only (named trajectories are read as named); ``now`` is
    the ``time.monotonic()`` the group ages count to (each session's ``finalized_at``).
    """
    # Linear: a read may name thousands of sessions.
    named = list(dict.fromkeys(sid for sid in (trajectory_id, session_id, *(session_ids or ())) if sid is not None))
    if trajectory_id is not None and session_id is not None and trajectory_id != session_id:
        raise ConfigError(f"trajectory_id {trajectory_id!r} and session_id {session_id!r} name different "
                          "trajectories; give one")
    if max_groups is not None and (isinstance(max_groups, bool) or not isinstance(max_groups, int) or max_groups < 1):
        raise ConfigError(f"max_groups must be a positive integer, got {max_groups!r}")
    if named or session_ids is not None:  # an empty session_ids is a named read of nothing
        found = [sid for sid in named if sid in finalized]
        missing = [sid for sid in named if sid not in finalized]
        if instance_id is not None:
            found = [sid for sid in found if group_key(finalized[sid]) == str(instance_id)]
        return ReadSelection("trajectory", [found], missing)
    groups: dict[str, list[str]] = {}
    for sid, done in finalized.items():
        key = group_key(done)
        if instance_id is None or key == str(instance_id):
            groups.setdefault(key, []).append(sid)
    rule = groups_rule or GroupRule()
    now = time.monotonic() if now is None else now
    chosen: list[tuple[str, list[str]]] = []
    incomplete: list[dict[str, Any]] = []
    for key, members in groups.items():
        age = max(0.0, now - min(float(getattr(finalized[sid], "finalized_at", now)) for sid in members))
        if rule.ready(len(members), age):
            chosen.append((key, members))
        else:
            incomplete.append({"key": key, "finalized": len(members), "age_s": round(age, 3)})
    if max_groups is not None:
        chosen = chosen[:max_groups]
    timed_out = [key for key, members in chosen if len(members) < rule.min_size]
    return ReadSelection("batch", [members for _, members in chosen], [], incomplete, timed_out)


def finalization_id(done: Any) -> str:
    """The id of one finalize of ``done`` (its finalize answer and every Segment's ``extra_info`` carry it):
    upstream's Harbor integration accepts a read only when all its Segments name one finalization. The
    finalize's own id (journaled with it, so a restart keeps it); one derived from the hand-over for a
    FinalizedSession made without one."""
    fid = getattr(done, "finalization_id", None)
    if fid:
        return fid
    return uuid.uuid5(_FINALIZATION_NS, f"{done.session_id}:{getattr(done, 'finalized_at', 0.0)!r}").hex


def upstream_segment_fields(seg: Any, *, versions: bool = True) -> dict[str, Any]:
    """Upstream's per-token arrays of one Segment, each over all ``tokens`` (prompt included):
    ``full_loss_mask`` (0 on the prompt), ``full_logprobs`` (0.0 on the prompt), ``full_versions``
    (``"-1"`` on the prompt and on environment tokens) and, with R3, ``routed_experts_chunks`` (one
    chunk of the T-1 rows, base64 of int32). A large field still in the TransferQueue is left out here:
    its references travel in ``format: samples``. ``versions`` false leaves ``full_versions`` out."""
    prompt = int(seg.prompt_length)
    out: dict[str, Any] = {"full_loss_mask": [0] * prompt + seg.loss_mask.astype(np.int64).tolist()}
    if versions:
        out["full_versions"] = [_CONTEXT_VERSION] * prompt + [str(int(v)) if v >= 0 else _CONTEXT_VERSION
                                                              for v in seg.token_versions.tolist()]
    if "logprobs" in seg.large and seg.is_resident("logprobs"):
        logprobs = seg.materialize("logprobs")
        out["full_logprobs"] = [0.0] * prompt + logprobs.astype(np.float64).tolist()
    if "routed_experts" in seg.large and seg.is_resident("routed_experts"):
        rows = np.ascontiguousarray(seg.materialize("routed_experts"), dtype=np.int32)
        out["routed_experts_chunks"] = [{"data": base64.b64encode(rows.tobytes()).decode("ascii"),
                                         "row_count": int(rows.shape[0]), "dtype": "int32"}]
    return out


@dataclass(frozen=True, slots=True)
class SegmentFormat:
    """What upstream's Segment objects carry (the Proxy's ``reads`` settings)."""

    record_token_versions: bool = True
    mask_nonlast_version_tokens: bool = False


def _segment_record(done: Any, seg: Any, count: int, form: SegmentFormat = SegmentFormat()) -> dict[str, Any]:
    meta = getattr(done, "metadata", {}) or {}
    out = seg.to_summary()
    out.update(trajectory_id=done.session_id, instance_id=meta.get("instance_id"), label=meta.get("label"),
               reward=done.reward, segment_index=seg.index, segment_count=count,
               uid=f"{done.session_id}:{seg.index}", aligned_response_length=int(seg.loss_mask.sum()))
    out.update(upstream_segment_fields(seg, versions=form.record_token_versions))
    out["extra_info"] = {"finalization_id": finalization_id(done), "finalization_complete": True,
                         "token_build_mode": "tito", "boundary_reason": seg.boundary_reason,
                         "step_ids": list(seg.step_ids), "trajectory_num_segments": count}
    if form.mask_nonlast_version_tokens:
        out["extra_info"]["mask_nonlast_version_tokens"] = True
    return out


def read_answer(selection: ReadSelection, finalized: Mapping[str, Any], *, drained: bool,
                stats: Mapping[str, Any], segments_of: Callable[[Any], list[Any]] | None = None,
                form: SegmentFormat = SegmentFormat()) -> dict[str, Any]:
    """Upstream's envelope for ``selection`` (``segments_of(done)`` may rebuild Segments in another view)."""
    segs = segments_of or (lambda done: done.segments)
    per_session: dict[str, list[dict[str, Any]]] = {}
    trajectories = []
    for sid in selection.session_ids:
        done = finalized[sid]
        seg_list = segs(done)
        records = [_segment_record(done, seg, len(seg_list), form) for seg in seg_list]
        per_session[sid] = records
        trajectories.append({"session_id": sid, "reward": done.reward, "metadata": done.metadata,
                             "segments": records})
    if selection.mode == "trajectory":
        data: list[Any] = [r for sid in selection.session_ids for r in per_session[sid]]
    else:
        data = [[r for sid in group for r in per_session[sid]] for group in selection.groups]
    return {"success": bool(selection.session_ids), "mode": selection.mode, "data": data,
            "meta_info": {**stats, "missing": selection.missing, "groups": len(selection.groups)
                          if selection.mode == "batch" else None, "incomplete_groups": selection.incomplete,
                          "timed_out_groups": selection.timed_out},
            "drained": bool(drained), "trajectories": trajectories}


def unknown_read_answer(missing: Sequence[str], *, drained: bool, stats: Mapping[str, Any]) -> dict[str, Any]:
    """A named read of trajectories this Proxy does not hold (never finalized here, or drained):
    upstream's clients raise on any error status and expect ``success: false`` with empty ``data``."""
    return {"success": False, "mode": "trajectory", "data": [],
            "meta_info": {**stats, "missing": list(missing), "groups": None, "incomplete_groups": []},
            "drained": bool(drained), "trajectories": []}
