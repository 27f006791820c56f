"""A rollout session: StepRecords linked by exact token-prefix lineage (create / append / branch).

Routing a call is a pure decision on token ids (:meth:`Session.route`); committing it
(:meth:`Session.commit_step`) validates everything first and changes the session only when every
check passed. Nothing here reads field data: large fields may be arrays or references.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Literal

import numpy as np

from dressage.errors import FieldShapeError, SessionStateError, TrajectoryError, UnknownStepError
from dressage.trajectory.pieces import trailing_shape
from dressage.trajectory.step import Boundary, StepRecord, check_rows, logprobs_array
from dressage.trajectory.tape import place_on_tape, share_messages, share_tools

__all__ = ["RouteDecision", "Session", "SessionState"]

SessionState = Literal["active", "finalized", "aborted"]


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where a new call attaches. ``kind`` is what it would be if committed now."""

    kind: Literal["create", "append", "branch"]
    parent_id: int | None
    routed_experts_start: int
    boundary: Boundary | None = None


_INT32 = np.dtype(np.int32)
_INT32_MAX = int(np.iinfo(np.int32).max)


def _as_ids(ids: Any, what: str) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise FieldShapeError(f"{what} must be a 1-D list of token ids, got shape {arr.shape}")
    if not arr.size:
        return arr.astype(np.int32, copy=False)
    if arr.dtype == _INT32:  # the Proxy's own arrays: only the sign can be out of range
        if int(arr.min()) < 0:
            raise FieldShapeError(f"{what} holds token ids outside 0..2**31-1")
        return arr
    if arr.dtype.kind not in "iu":
        raise FieldShapeError(f"{what} must hold integers, got dtype {arr.dtype}")
    if int(arr.min()) < 0 or int(arr.max()) > _INT32_MAX:
        raise FieldShapeError(f"{what} holds token ids outside 0..2**31-1")
    return arr.astype(np.int32, copy=False)


def _is_prefix(ids: np.ndarray, head: np.ndarray) -> bool:
    """``np.array_equal(ids[:len(head)], head)`` for 1-D id arrays (bytes compared when both are int32)."""
    if len(head) > len(ids):
        return False
    part = ids[:len(head)]
    if part.dtype == head.dtype == _INT32:
        return part.tobytes() == head.tobytes()
    return bool(np.array_equal(part, head))


def _canonical_tools(tools: Any) -> str | None:
    return None if tools is None else json.dumps(tools, sort_keys=True, separators=(",", ":"))


_CLASSIFIED = frozenset({"new_session", "new_conversation", "history_rewrite", "tito_mismatch", "retry"})
"""Boundary reasons :meth:`Session.route` derives from the session's steps (re-derived at commit)."""
_OPENING_ROLES = ("system", "developer")


def _opening_messages(messages: Any) -> list[tuple[Any, Any]] | None:
    """Role and content of the messages that open a chat: its leading system / developer messages,
    or its first message when it has none (``None``: no chat messages known)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        return None
    out = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in _OPENING_ROLES:
            break
        out.append((m.get("role"), m.get("content")))
    if not out:
        first = messages[0]
        out = [(first.get("role"), first.get("content"))] if isinstance(first, dict) else [(None, first)]
    return out


def _opens_within(ids: np.ndarray, limit: int, special: frozenset[int]) -> bool:
    """Whether the first message of ``ids`` ends within its first ``limit`` tokens.

    The first message ends at the first special token after a plain one (ChatML's ``<|im_end|>``
    closing the system message). Ids with no special token at all have no template to read:
    their opening is their first token.
    """
    if not special:
        return limit >= 1
    head = ids[:limit]
    marks = np.isin(head, np.fromiter(special, dtype=np.int64, count=len(special)))
    plain = np.flatnonzero(~marks)
    if plain.size and np.flatnonzero(marks[plain[0]:]).size:
        return True
    if len(ids) > limit and np.isin(ids, np.fromiter(special, dtype=np.int64, count=len(special))).any():
        return False  # the first message ends after the shared prefix
    return limit >= 1


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class Session:
    """One rollout session.

    ``r3_shape`` is ``(num_layers, topk)`` when Rollout Routing Replay is on; every step must then
    carry routed experts for its rows. ``decode`` and ``special_ids`` (from the tokenizer) let the
    session classify near-miss prefixes; both are optional.
    """

    def __init__(self, session_id: str, *, metadata: dict[str, Any] | None = None,
                 r3_shape: tuple[int, int] | None = None, record_logprobs: bool = True,
                 decode: Callable[[np.ndarray], str] | None = None,
                 special_ids: Iterable[int] = ()) -> None:
        self.session_id = str(session_id)
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.r3_shape = None if r3_shape is None else (int(r3_shape[0]), int(r3_shape[1]))
        self.record_logprobs = bool(record_logprobs)
        self.decode = decode
        self.special_ids = frozenset(int(i) for i in special_ids)
        self.steps: dict[int, StepRecord] = {}
        self.children: dict[int, list[int]] = {}
        self.state: SessionState = "active"
        self.reward: float | None = None
        self.finalization_id: str | None = None
        """The id of its finalize (a journal replay keeps it): what every read of its Segments names."""
        self.abort_reason: str | None = None
        self.created_at = time.time()
        self._next_lineage = 0

    # ----------------------------------------------------------------- queries
    def step(self, step_id: int) -> StepRecord:
        try:
            return self.steps[step_id]
        except KeyError:
            raise UnknownStepError(f"session {self.session_id}: no step {step_id}") from None

    def path_to(self, step_id: int) -> list[StepRecord]:
        """Steps from the tree root down to ``step_id``."""
        out = []
        cur: int | None = step_id
        while cur is not None:
            s = self.step(cur)
            out.append(s)
            cur = s.parent_id
        return out[::-1]

    def leaves(self) -> list[StepRecord]:
        return [s for s in self.steps.values() if not self.children.get(s.step_id)]

    # ----------------------------------------------------------------- routing
    def route(self, prompt_ids: Any, *, tools: Any = None, messages: Any = None) -> RouteDecision:
        """Decide create / append / branch for a call with ``prompt_ids`` (reads no field data).

        The parent is the step whose prompt + response ids are the longest exact prefix of the
        new prompt; ties go to the most recent step.
        """
        prompt = _as_ids(prompt_ids, "prompt_ids")
        if prompt.size == 0:
            raise FieldShapeError("prompt_ids is empty")
        best: StepRecord | None = None
        for s in self.steps.values():
            if s.seq_len <= len(prompt) and (best is None or s.seq_len >= best.seq_len):
                if _is_prefix(prompt, s.full_ids):
                    best = s
        if best is not None:
            if tools is not None and best.tools is not None and _canonical_tools(tools) != _canonical_tools(best.tools):
                return RouteDecision("create", None, 0,
                                     Boundary("tool_schema_change", matched_tokens=best.seq_len,
                                              candidate_step=best.step_id))
            kind = "branch" if self.children.get(best.step_id) else "append"
            return RouteDecision(kind, best.step_id, best.end_row)
        return RouteDecision("create", None, 0, self._classify_boundary(prompt, tools, messages))

    def shares_opening(self, step: StepRecord, prompt: np.ndarray, messages: Any = None, tools: Any = None,
                       lcp: int | None = None) -> bool:
        """Whether a call (``prompt``, ``messages``, ``tools``) opens as ``step``'s conversation did.

        A call that repeats the step's whole prompt does. Else, with chat messages on both: the same
        leading system / developer messages (or, with none, the same first message) and the same tools. Otherwise on token ids: the longest common
        prefix of the two prompts covers the first message of each (see :func:`_opens_within`).
        A title-generation call or a sub-agent (another system prompt, other tools) shares no
        opening with the agent loop beside it; a compressed history of the same chat does.
        """
        n = _common_prefix(prompt, step.prompt_ids) if lcp is None else min(lcp, step.prompt_len)
        if n >= step.prompt_len:
            return True  # it repeats the step's whole prompt: the same conversation, whatever follows
        mine, theirs = _opening_messages(messages), _opening_messages(step.messages)
        if mine is not None and theirs is not None:
            return mine == theirs and (tools is None) == (step.tools is None) and (
                tools is None or _canonical_tools(tools) == _canonical_tools(step.tools))
        return _opens_within(prompt, n, self.special_ids) and _opens_within(step.prompt_ids, n, self.special_ids)

    def _classify_boundary(self, prompt: np.ndarray, tools: Any = None, messages: Any = None) -> Boundary:
        """Why a call that extends no step starts a Segment of its own:

        - ``new_session``: the session has no step yet;
        - ``retry`` / ``tool_schema_change``: an earlier root's prompt again (same / other tools);
        - ``new_conversation``: it shares no opening (:meth:`shares_opening`) with any earlier step,
          whatever order the steps were committed in (OpenCode's title call beside its agent loop,
          a sub-agent);
        - ``history_rewrite``: it diverges from a step of its own conversation before that step's
          last reply (the history was compressed or edited);
        - ``tito_mismatch``: it repeats a step's prompt and reply but with other ids after them.
        """
        if not self.steps:
            return Boundary("new_session")
        for s in self.steps.values():
            if s.prompt_len == len(prompt) and np.array_equal(s.prompt_ids, prompt):
                # The same prompt again (the agent retried its first call): a sibling root.
                same_tools = tools is None or s.tools is None or _canonical_tools(tools) == _canonical_tools(s.tools)
                return Boundary("retry" if same_tools else "tool_schema_change", matched_tokens=len(prompt),
                                candidate_step=s.step_id)
        cand, lcp = None, -1
        for s in self.steps.values():
            n = _common_prefix(prompt, s.full_ids)
            if n >= lcp and self.shares_opening(s, prompt, messages, tools, lcp=n):
                cand, lcp = s, n
        if cand is None:
            return Boundary("new_conversation")
        if lcp < cand.prompt_len:
            # Diverges before the candidate's last reply: the agent rewrote or compressed history.
            return Boundary("history_rewrite", matched_tokens=lcp, candidate_step=cand.step_id)
        old_tail, new_tail = cand.full_ids[lcp:], prompt[lcp:]
        first = [int(x) for x in (old_tail[:1].tolist() + new_tail[:1].tolist())]
        if any(t in self.special_ids for t in first):
            drift = "template"
        elif self.decode is not None and self.decode(new_tail).startswith(self.decode(old_tail)):
            drift = "retokenization"
        else:
            drift = "other"
        return Boundary("tito_mismatch", drift=drift, matched_tokens=lcp, candidate_step=cand.step_id)

    # ------------------------------------------------------------------ commit
    def commit_step(self, decision: RouteDecision, **step: Any) -> StepRecord:
        """Validate and record one step (:meth:`prepare_step` then :meth:`insert_step`).

        On any error the session is unchanged.
        """
        return self.insert_step(self.prepare_step(decision, **step))

    def prepare_step(self, decision: RouteDecision, *, prompt_ids: Any, response_ids: Any,
                     logprobs: Any = None, routed_experts: Any = None,
                     routed_experts_start: int | None = None, token_versions: Any = 0,
                     messages: Any = None, tools: Any = None, boundary_reason: str | None = None,
                     metadata: dict[str, Any] | None = None, created_at: float | None = None) -> StepRecord:
        """Validate a step and build its record without changing the session.

        The record is valid for :meth:`insert_step` until the session changes.
        """
        if self.state != "active":
            raise SessionStateError(f"session {self.session_id} is {self.state}; it takes no more steps")
        prompt = _as_ids(prompt_ids, "prompt_ids")
        response = _as_ids(response_ids, "response_ids")
        if prompt.size == 0 or response.size == 0:
            raise FieldShapeError("a step needs a non-empty prompt and response")
        parent = None
        if decision.parent_id is not None:
            parent = self.step(decision.parent_id)
            if parent.seq_len > len(prompt) or not _is_prefix(prompt, parent.full_ids):
                raise TrajectoryError(
                    f"step {parent.step_id} is not a prefix of this prompt; route the call again"
                )
        R = len(response)
        if logprobs is None and self.record_logprobs:
            raise FieldShapeError("logprobs are required for every step of this session")
        if isinstance(logprobs, (list, tuple)):
            logprobs = logprobs_array(logprobs)
        if isinstance(logprobs, np.ndarray):
            if logprobs.ndim != 1:
                raise FieldShapeError(f"logprobs must be 1-D, got shape {logprobs.shape}")
            logprobs = logprobs_array(logprobs)
        check_rows(logprobs, R, f"logprobs vs {R} response tokens")
        start = decision.routed_experts_start if routed_experts_start is None else int(routed_experts_start)
        limit = parent.end_row if parent is not None else 0
        if self.r3_shape is not None:
            if routed_experts is None:
                raise FieldShapeError("routed_experts are required (Rollout Routing Replay is on)")
            if not 0 <= start <= limit:
                raise FieldShapeError(
                    f"routed_experts_start {start} leaves a gap: the rows must start at or before {limit}"
                )
            check_rows(routed_experts, len(prompt) + R - 1 - start,
                       f"routed_experts vs T-1-start = {len(prompt)}+{R}-1-{start}")
            if trailing_shape(routed_experts) != self.r3_shape:
                raise FieldShapeError(
                    f"routed_experts rows are {trailing_shape(routed_experts)}, expected {self.r3_shape} "
                    "(num_layers, topk)"
                )
            if isinstance(routed_experts, np.ndarray) and routed_experts.dtype.kind not in "iu":
                raise FieldShapeError(f"routed_experts must hold integers, got {routed_experts.dtype}")
        elif routed_experts is not None:
            raise FieldShapeError("routed_experts given but this session has Rollout Routing Replay off")
        versions = np.asarray(token_versions)
        if versions.ndim == 0:
            versions = np.full(R, int(versions), dtype=np.int32)
        elif versions.shape != (R,):
            raise FieldShapeError(f"token_versions has shape {versions.shape}, expected ({R},)")
        versions = versions.astype(np.int32, copy=False)

        # Every check passed. The kind is re-derived now, as another call may have extended the
        # parent since the decision was made.
        parent_id = None if parent is None else parent.step_id
        step_id, lineage, branch_from = self._attach(parent_id)
        boundary = None
        if parent is None:
            boundary = decision.boundary or Boundary(boundary_reason or "new_session")
            if boundary_reason:
                boundary = Boundary(boundary_reason, boundary.drift, boundary.matched_tokens, boundary.candidate_step)
            elif boundary.reason in _CLASSIFIED:
                # Against the steps committed now, not those there were when the call was routed.
                boundary = self._classify_boundary(prompt, tools, messages)
        now = time.time()
        return StepRecord(
            step_id=step_id, prompt_ids=prompt, response_ids=response, logprobs=logprobs,
            routed_experts=routed_experts, routed_experts_start=start if self.r3_shape else 0,
            token_versions=versions, parent_id=parent_id,
            lineage_id=lineage, branch_from=branch_from, boundary=boundary, messages=messages,
            tools=tools, created_at=created_at or now, finished_at=now, metadata=dict(metadata or {}),
        )

    def _attach(self, parent_id: int | None) -> tuple[int, int, int | None]:
        """Step id, lineage and branch point of a step under ``parent_id`` inserted now: a root or a
        second child starts a lineage (the second child branching from its parent), a first child
        continues its parent's."""
        if parent_id is None:
            return len(self.steps), self._next_lineage, None
        if self.children.get(parent_id):
            return len(self.steps), self._next_lineage, parent_id
        return len(self.steps), self.steps[parent_id].lineage_id, None

    def rebase(self, rec: StepRecord, **fields: Any) -> StepRecord:
        """``rec`` (from :meth:`prepare_step`) placed on the session as it stands now, with ``fields``
        (large fields by reference, say) in place of its own, ready for :meth:`insert_step`.

        Nothing is validated again, as nothing validated can have changed: an active session never
        drops a step and a step's ids never change, and ``fields`` are the stored rows of the values
        they replace. Only where the record attaches can change, when another call of the session
        was inserted since it was prepared: its step id, an append whose parent got a child
        meanwhile becomes a branch, and a root's boundary reason is derived again (a first call
        committed after another conversation's is a ``new_conversation``, not a ``new_session``). Returns ``rec`` itself when nothing differs, else a copy, so a
        record already handed out stays as it was validated.
        """
        step_id, lineage, branch_from = self._attach(rec.parent_id)
        changes = {name: value for name, value in fields.items() if getattr(rec, name) is not value}
        if (step_id, lineage, branch_from) != (rec.step_id, rec.lineage_id, rec.branch_from):
            changes.update(step_id=step_id, lineage_id=lineage, branch_from=branch_from)
        if rec.parent_id is None and rec.boundary is not None and rec.boundary.reason in _CLASSIFIED:
            # Another conversation's step committed first: the root's reason follows what is there now.
            boundary = self._classify_boundary(rec.prompt_ids, rec.tools, rec.messages)
            if boundary != rec.boundary:
                changes["boundary"] = boundary
        if not changes:
            return rec
        return replace(rec, metadata=dict(rec.metadata), **changes)  # the copy's metadata is its own

    def check_insertable(self, rec: StepRecord) -> None:
        """Raise what :meth:`insert_step` would refuse ``rec`` with, changing nothing (a caller journals
        the step in between: a session that ended, or moved past the record, must not get it journaled)."""
        if self.state != "active":
            raise SessionStateError(f"session {self.session_id} is {self.state}; it takes no more steps")
        if rec.step_id != len(self.steps) or (rec.parent_id is not None and rec.parent_id not in self.steps):
            raise TrajectoryError(f"session {self.session_id} changed since step {rec.step_id} was prepared")
        siblings = self.children.get(rec.parent_id, []) if rec.parent_id is not None else []
        if rec.lineage_id not in (self._next_lineage,) and siblings:
            raise TrajectoryError(f"session {self.session_id} changed since step {rec.step_id} was prepared")

    def insert_step(self, rec: StepRecord) -> StepRecord:
        """Add a record from :meth:`prepare_step`; refuses one the session has moved past."""
        self.check_insertable(rec)
        if rec.lineage_id == self._next_lineage:
            self._next_lineage += 1
        parent = None if rec.parent_id is None else self.steps[rec.parent_id]
        place_on_tape(rec, parent)  # the lineage's tokens once, not a prompt copy per step
        rec.messages = share_messages(rec.messages, parent)
        rec.tools = share_tools(rec.tools, parent)
        self.steps[rec.step_id] = rec
        if rec.parent_id is not None:
            self.children.setdefault(rec.parent_id, []).append(rec.step_id)
        return rec

    def add_step(self, prompt_ids: Any, response_ids: Any, **kwargs: Any) -> StepRecord:
        """Route and commit in one call (``tools`` also takes part in routing)."""
        decision = self.route(prompt_ids, tools=kwargs.get("tools"), messages=kwargs.get("messages"))
        return self.commit_step(decision, prompt_ids=prompt_ids, response_ids=response_ids, **kwargs)

    # --------------------------------------------------------------- lifecycle
    def check_finalizable(self, *, allow_empty: bool = False) -> None:
        """Raise what :meth:`finalize` would, changing nothing (a caller journals in between).

        A session without steps is refused unless ``allow_empty`` (a Proxy's finalize that ran out of
        wait while the session's first call was still in flight: it ends the session all the same)."""
        if self.state != "active":
            raise SessionStateError(f"session {self.session_id} is already {self.state}")
        if not self.steps and not allow_empty:
            raise SessionStateError(f"session {self.session_id} has no steps to finalize")

    def finalize(self, reward: float | None = None, *, allow_empty: bool = False,
                 finalization_id: str | None = None) -> None:
        """``finalization_id``: the id of this finalize (a fresh one when not given)."""
        self.check_finalizable(allow_empty=allow_empty)
        self.reward = None if reward is None else float(reward)
        self.finalization_id = finalization_id or uuid.uuid4().hex
        self.state = "finalized"

    def check_abortable(self) -> None:
        """Raise what :meth:`abort` would, changing nothing."""
        if self.state == "finalized":
            raise SessionStateError(f"session {self.session_id} is already finalized")

    def abort(self, reason: str = "aborted") -> None:
        self.check_abortable()
        self.state, self.abort_reason = "aborted", reason

    def seal(self, keep: Iterable[int] = ()) -> None:
        """Drop what only routing new calls needs, once the session takes no more: the chat history,
        tool schemas and assistant message of each step but those of ``keep`` (the steps that end a
        Segment: their conversation is what an export or the viewer shows of it), and the token slack
        kept for more turns. Tokens, large fields, lineage and the rest of the metadata (what Segments
        and Samples are built from) stay as they are."""
        if self.state == "active":
            raise SessionStateError(f"session {self.session_id} is still active; only a finished one is sealed")
        kept = frozenset(int(i) for i in keep)
        tapes = {}
        for st in self.steps.values():
            if st.step_id not in kept:
                st.messages = st.tools = None
                if isinstance(st.metadata, dict):
                    st.metadata.pop("assistant_message", None)
            if st._tape is not None:
                tapes[id(st._tape)] = st._tape
        for tape in tapes.values():
            tape.seal()

    def retry_orphans(self) -> set[int]:
        """Childless steps with a sibling that has children: calls the agent retried and dropped.

        Roots count as siblings when their prompts are identical (the first call was retried).
        """
        groups: dict[Any, list[StepRecord]] = {}
        for s in self.steps.values():
            key = ("p", s.parent_id) if s.parent_id is not None else ("r", s.prompt_ids.tobytes())
            groups.setdefault(key, []).append(s)
        orphans: set[int] = set()
        for sibs in groups.values():
            if len(sibs) > 1 and any(self.children.get(s.step_id) for s in sibs):
                orphans.update(s.step_id for s in sibs if not self.children.get(s.step_id))
        return orphans

    def large_field_refs(self) -> list[Any]:
        """Every non-resident large-field value of every step (e.g. to clear them on abort)."""
        out = []
        for s in self.steps.values():
            for value in (s.logprobs, s.routed_experts):
                if value is not None and not isinstance(value, np.ndarray):
                    out.append(value)
        return out

    def __repr__(self) -> str:
        return f"Session({self.session_id!r}, steps={len(self.steps)}, state={self.state})"

