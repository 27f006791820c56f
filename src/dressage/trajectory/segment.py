"""Segments: trainable units composed from StepRecords by a lineage or a timeline view.

A Segment holds resident token-level fields and, for each large field, an ordered list of
pieces (rows of a step's value). Building one never reads or copies large-field data, so a
shared prefix is stored once however many Segment views use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import numpy as np

from dressage.errors import ConfigError, FieldShapeError
from dressage.fields.r3 import decode_routed_experts
from dressage.trajectory.pieces import Fill, Piece, concat_pieces, pieces_resident, pieces_rows, resolve_resident
from dressage.trajectory.session import Session
from dressage.trajectory.step import StepRecord

__all__ = ["Segment", "build_segments", "segment_ends", "lineage_chains", "timeline_chains", "materialize_pieces",
           "SHARED_PREFIX_LOSS"]

View = Literal["lineage", "timeline"]
SharedPrefixLoss = Literal["once", "every"]
SHARED_PREFIX_LOSS = ("once", "every")


@dataclass(slots=True, eq=False, kw_only=True)
class Segment:
    """One trainable unit: ``tokens`` = prompt + response, fields over the response / T-1 rows."""

    session_id: str
    index: int
    step_ids: tuple[int, ...]
    """Steps whose responses are trained, in order; each extends the previous one."""
    tokens: np.ndarray
    prompt_length: int
    loss_mask: np.ndarray
    token_versions: np.ndarray
    boundary_reason: str
    branch_from: int | None = None
    large: dict[str, tuple[Piece | Fill, ...]] = field(default_factory=dict)
    """``logprobs`` (response) and ``routed_experts`` (T-1 rows) as pieces."""
    r3_trailing: tuple[int, ...] = ()

    @property
    def response_length(self) -> int:
        return int(self.tokens.shape[0]) - self.prompt_length

    @property
    def total_length(self) -> int:
        return int(self.tokens.shape[0])

    def version_span(self) -> tuple[int, int] | None:
        """(min, max) policy version over trained tokens; ``None`` if nothing is trained."""
        trained = self.token_versions[self.loss_mask.astype(bool)]
        if trained.size == 0:
            return None
        return int(trained.min()), int(trained.max())

    def version_runs(self) -> list[tuple[int, int]]:
        """Run-length form of the response's versions: [(version, count), ...]; -1 = environment."""
        v = self.token_versions
        if v.size == 0:
            return []
        cut = np.flatnonzero(np.diff(v)) + 1
        starts = np.concatenate([[0], cut])
        ends = np.concatenate([cut, [v.size]])
        return [(int(v[a]), int(b - a)) for a, b in zip(starts, ends)]

    def is_resident(self, name: str) -> bool:
        return pieces_resident(self.large.get(name, ()))

    def materialize(self, name: str, resolve: Callable[[Piece], np.ndarray] = resolve_resident) -> np.ndarray | None:
        """Compose a large field into its training form (R3 restored to int32)."""
        pieces = self.large.get(name)
        return None if pieces is None else materialize_pieces(name, pieces, self.r3_trailing, resolve)

    def large_field_nbytes(self, name: str) -> int:
        pieces = self.large.get(name, ())
        return sum(_row_nbytes(p.value) * p.rows for p in pieces if isinstance(p, Piece))

    def to_summary(self) -> dict[str, Any]:
        """JSON-friendly view (large fields as sizes, not values)."""
        return {
            "session_id": self.session_id, "index": self.index, "step_ids": list(self.step_ids),
            "tokens": self.tokens.tolist(), "prompt_length": self.prompt_length,
            "response_length": self.response_length, "loss_mask": self.loss_mask.tolist(),
            "boundary_reason": self.boundary_reason, "branch_from": self.branch_from,
            "version_span": self.version_span(), "version_runs": self.version_runs(),
            "large_fields": {n: {"rows": pieces_rows(p), "bytes": self.large_field_nbytes(n),
                                 "resident": self.is_resident(n)} for n, p in self.large.items()},
        }


def materialize_pieces(name: str, pieces: Sequence[Piece | Fill], r3_trailing: tuple[int, ...] = (),
                       resolve: Callable[[Piece], np.ndarray] = resolve_resident) -> np.ndarray:
    """One large field from its pieces: ``logprobs`` float32, ``routed_experts`` restored to int32."""
    if name == "logprobs":
        return concat_pieces(pieces, np.float32, (), resolve)
    if name == "routed_experts":
        for dtype in {np.dtype(p.value.dtype) for p in pieces if isinstance(p, Piece)}:
            decode_routed_experts(np.empty(0, dtype))  # a stored dtype R3 may have, or FieldShapeError
        # Straight into the final int32 array, each piece widened as it is copied: no array of the
        # stored dtype in between, so the restore's peak is the restored bytes.
        return concat_pieces(pieces, np.int32, tuple(r3_trailing), resolve)
    raise FieldShapeError(f"no large field {name!r}")


def _row_nbytes(value: Any) -> int:
    """Bytes of one row of an array or reference (both expose ``shape`` and ``dtype``)."""
    return int(np.dtype(value.dtype).itemsize * int(np.prod(value.shape[1:], dtype=np.int64)))


def lineage_chains(session: Session, drop: set[int] = frozenset()) -> list[list[StepRecord]]:
    """One root-to-leaf chain per leaf (after dropping ``drop``), in leaf call order."""
    kept = {i for i in session.steps if i not in drop}
    has_child = {session.steps[c].parent_id for c in kept if session.steps[c].parent_id is not None}
    chains = []
    for sid in sorted(kept):
        if sid not in has_child:
            chains.append(session.path_to(sid))
    return chains


def timeline_chains(session: Session, drop: set[int] = frozenset()) -> list[list[StepRecord]]:
    """Steps in call order, cut whenever a step does not extend the one called just before."""
    chains: list[list[StepRecord]] = []
    for sid in sorted(session.steps):
        if sid in drop:
            continue
        s = session.steps[sid]
        if chains and s.parent_id == chains[-1][-1].step_id:
            chains[-1].append(s)
        else:
            chains.append([s])
    return chains


def _start_reason(session: Session, step: StepRecord) -> str:
    """Why a Segment's first trained step is not the continuation of an earlier one."""
    if step.boundary is not None:
        return step.boundary.reason
    siblings = [session.steps[c] for c in session.children.get(step.parent_id, ()) if c != step.step_id]
    if any(np.array_equal(o.prompt_ids, step.prompt_ids) for o in siblings):
        return "retry"
    if step.branch_from is not None or siblings:
        return "branch"
    return "timeline_cut"


def _compose(session: Session, chain: list[StepRecord], index: int, reason: str) -> Segment:
    first, last = chain[0], chain[-1]
    tokens = last.full_ids
    prompt_len = first.prompt_len
    mask_parts, version_parts, lp_pieces = [], [], []
    for k, s in enumerate(chain):
        R = s.response_len
        mask_parts.append(np.ones(R, dtype=np.int8))
        version_parts.append(s.token_versions)
        if s.logprobs is not None:
            lp_pieces.append(Piece(s.logprobs, 0, R))
        if k + 1 < len(chain):
            env = chain[k + 1].prompt_len - s.seq_len  # tool results, template glue
            mask_parts.append(np.zeros(env, dtype=np.int8))
            version_parts.append(np.full(env, -1, dtype=np.int32))
            if s.logprobs is not None and env:
                lp_pieces.append(Fill(env, 0.0))
    large: dict[str, tuple[Piece | Fill, ...]] = {}
    if first.logprobs is not None:
        large["logprobs"] = tuple(lp_pieces)
    trailing: tuple[int, ...] = ()
    if session.r3_shape is not None:
        # R3 rows [0, T-1) come from every step on the path from the tree root: each step holds
        # the rows from where its parent's ended, so ancestors above the chain supply the prompt.
        r3: list[Piece] = []
        covered = 0
        for s in session.path_to(last.step_id):
            lo = covered - s.routed_experts_start
            hi = s.end_row - s.routed_experts_start
            if hi > lo:
                r3.append(Piece(s.routed_experts, lo, hi))
            covered = s.end_row
        large["routed_experts"] = tuple(r3)
        trailing = session.r3_shape
    branch_from = next((s.branch_from for s in session.path_to(last.step_id) if s.branch_from is not None), None)
    return Segment(
        session_id=session.session_id, index=index, step_ids=tuple(s.step_id for s in chain),
        tokens=tokens, prompt_length=prompt_len, loss_mask=np.concatenate(mask_parts),
        token_versions=np.concatenate(version_parts).astype(np.int32, copy=False),
        boundary_reason=reason, branch_from=branch_from, large=large, r3_trailing=trailing,
    )


def _chains(session: Session, view: View, drop_retry_orphans: bool) -> list[list[StepRecord]]:
    if view not in ("lineage", "timeline"):
        raise ConfigError(f"segment view must be 'lineage' or 'timeline', got {view!r}")
    drop = session.retry_orphans() if drop_retry_orphans else set()
    return lineage_chains(session, drop) if view == "lineage" else timeline_chains(session, drop)


def segment_ends(session: Session, view: View = "lineage", *, drop_retry_orphans: bool = False) -> set[int]:
    """Ids of the steps that end a Segment of :func:`build_segments` with the same arguments (whatever
    ``shared_prefix_loss``: it moves where a Segment starts, never where it ends)."""
    return {chain[-1].step_id for chain in _chains(session, view, drop_retry_orphans)}


def build_segments(session: Session, view: View = "lineage", *, drop_retry_orphans: bool = False,
                   max_length: int | None = None, shared_prefix_loss: SharedPrefixLoss = "once") -> list[Segment]:
    """Build the session's Segments. Reads no large-field data and writes none.

    ``shared_prefix_loss="once"`` (default): every generated token has loss mask 1 in exactly one
    Segment. A lineage chain whose first steps an earlier Segment already trains starts at its
    first new step, with the shared turns as prompt (context). ``"every"``: each lineage Segment
    trains its whole root-to-leaf chain, so turns shared by branches are trained once per branch.
    The timeline view trains each step once either way. A Segment is labelled by the step where
    it leaves what earlier Segments hold (``branch``, ``retry``, a boundary reason, ...).
    """
    if shared_prefix_loss not in SHARED_PREFIX_LOSS:
        raise ConfigError(f"shared_prefix_loss must be 'once' or 'every', got {shared_prefix_loss!r}")
    chains = _chains(session, view, drop_retry_orphans)
    segments, seen = [], set()
    for i, chain in enumerate(chains):
        # Chains are root-to-leaf (lineage) or disjoint (timeline), and each ends at a step no
        # earlier chain holds, so the steps an earlier Segment holds are a prefix of this chain.
        new_at = next(k for k, s in enumerate(chain) if s.step_id not in seen)
        seen.update(s.step_id for s in chain)
        reason = _start_reason(session, chain[new_at])
        segments.append(_compose(session, chain[new_at:] if shared_prefix_loss == "once" else chain, i, reason))
    if max_length is not None:
        for seg in segments:
            if seg.total_length > max_length:
                raise FieldShapeError(
                    f"segment {seg.index} of session {session.session_id} has {seg.total_length} tokens, "
                    f"over the context window {max_length}"
                )
    return segments
