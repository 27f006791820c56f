"""Proxy core: SGLang responses -> StepRecords, through one commit region (:meth:`ProxyCore.begin_step`).

The service (``dressage.proxy.service``) calls this; so can any embedding. Online decisions
(routing, versions) and Segment construction at finalize read nothing from TransferQueue.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from dressage.errors import DressageError, SessionStateError, TransferWriteError, UnknownSessionError
from dressage.fields import GenerateOutput, RoutedExpertsSpec, decode_generate_response, encode_routed_experts, r3_dtype
from dressage.dataplane import DataPlaneConfig
from dressage.proxy.recording.weights import step_labels
from dressage.proxy.recording.write_behind import PendingStep, WriteBehind, done_step
from dressage.tq.client.renewal import KeyRenewal
from dressage.trajectory import Boundary, RouteDecision, Segment, Session, StepRecord, build_segments
from dressage.trajectory.sample import VERSION_LABELS_KEY
from dressage.trajectory.segment import segment_ends
from dressage.trajectory.step import logprobs_array

__all__ = ["ProxyCore", "FinalizedSession", "LOST_FIELDS_KEY"]

_WHERE_CHUNK = 4096
LOST_FIELDS_KEY = "large_fields_lost"
"""Metadata of a trajectory recovered from a journal whose TQ keys are gone: how many keys are lost."""


@dataclass(slots=True)
class _KeyNames:
    """The TQ keys of one life of a session id: ``{session}/{incarnation}.{call}/{field}``.

    ``incarnation`` is the Proxy's epoch (drawn at each start) and the life's number within that start.
    TQ keys are write-once and the reader of an earlier life may still hold its keys, so a drained id
    used again, or a session resumed after a restart, never names a key an earlier life wrote.
    """

    incarnation: str
    calls: int = 0

    def next_call(self, session_id: str, fields: list[str]) -> list[str]:
        """The keys of the next call's ``fields``."""
        call, self.calls = self.calls, self.calls + 1
        return [f"{session_id}/{self.incarnation}.{call}/{n}" for n in fields]


@dataclass(slots=True)
class FinalizedSession:
    """What finalize hands to the RolloutManager: lightweight Segments plus session metadata."""

    session_id: str
    segments: list[Segment]
    reward: float | None
    metadata: dict[str, Any] = field(default_factory=dict)
    released_refs: list[Any] = field(default_factory=list)
    """Refs of steps no Segment uses (dropped retry orphans): deleted from TQ at finalize."""
    finalized_at: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` when it was handed over: a batch read's group age counts from here. A journal
    replay hands finalized sessions over again, so after a restart the age counts from the replay."""
    finalization_id: str | None = None
    """The id of the session's finalize (journaled with it, so the same after a restart)."""


@dataclass(frozen=True, slots=True)
class RoutedExpertsCodec:
    """The R3 storage of one ProxyCore (``--routed-experts-dtype``): what :meth:`ProxyCore.normalize`
    decodes the engine's routing into and what a step's routing is range-checked and stored as."""

    spec: RoutedExpertsSpec
    dtype: np.dtype

    @classmethod
    def of(cls, config: DataPlaneConfig) -> "RoutedExpertsCodec | None":
        """The codec of ``config``; ``None`` with Rollout Routing Replay off."""
        if not config.use_rollout_routing_replay:
            return None
        spec = RoutedExpertsSpec.of(config.model, config.routed_experts_dtype)
        return cls(spec, r3_dtype(spec.storage_dtype))

    def decode_options(self) -> dict[str, Any]:
        """The routing options of :func:`dressage.fields.decode_generate_response`."""
        s = self.spec
        return {"want_routed_experts": True, "num_layers": s.num_layers, "topk": s.topk,
                "routed_experts_dtype": s.storage_dtype, "num_experts": s.num_experts}

    def encode(self, ids: Any, *, checked: bool = False) -> np.ndarray:
        """``ids`` in the storage dtype, range-checked. ``checked``: the routing came out of
        :meth:`ProxyCore.normalize` (range-checked into the storage dtype there), so an array
        already in that dtype is taken as it is."""
        if checked and isinstance(ids, np.ndarray) and ids.ndim == 3 and ids.dtype == self.dtype:
            return ids
        return encode_routed_experts(ids, self.spec.storage_dtype, num_experts=self.spec.num_experts)


class ProxyCore:
    """Sessions of one Proxy and the commit region that records their steps.

    ``tq`` is a TransferQueue client (``put_many`` / ``delete``) and is required when
    ``config.enable_transfer_queue``. ``sink`` receives each :class:`FinalizedSession`.
    ``write_behind``: :meth:`begin_step` answers before the TQ write lands (see
    :mod:`dressage.proxy.recording.write_behind`).

    The TQ keys of every session held here (live, or finalized and not yet forgotten) are kept out of
    the TransferQueue's retention sweep by :attr:`renewal` (``tq/client/renewal.py``), started by the
    first step written; a forgotten session's keys are renewed once more as they are handed on.
    """

    def __init__(self, config: DataPlaneConfig, tq: Any = None, *, sink: Callable[[FinalizedSession], None] | None = None,
                 decode: Callable[[np.ndarray], str] | None = None, special_ids: Sequence[int] = (),
                 batch_tag: Callable[[], str | None] | None = None, journal: Any = None,
                 write_behind: bool = True) -> None:
        if config.enable_transfer_queue and tq is None:
            raise TransferWriteError("TransferQueue is enabled but no TransferQueue client was given")
        self.config = config
        self.tq = tq
        self.sink = sink
        self._decode = decode
        self._special_ids = tuple(special_ids)
        self._batch_tag = batch_tag or (lambda: None)
        self.journal = journal
        self.write_behind = WriteBehind(tq, enabled=write_behind)
        self.renewal: KeyRenewal | None = None
        """Renews the held sessions' TQ keys (``None``: a client that cannot, e.g. a test double)."""
        if callable(getattr(tq, "touch", None)):
            core = weakref.ref(self)
            self.renewal = KeyRenewal(tq, lambda: [] if (c := core()) is None else c.held_keys(),
                                      name="proxy-tq-renewal")
            weakref.finalize(self, self.renewal.close, False)  # a core dropped without close() stops it too
        self._r3 = RoutedExpertsCodec.of(config)
        # Drawn at each start: keys stay unique across restarts of a Proxy that recovered its sessions from a
        # journal (48 random bits: two starts of one Proxy drawing the same epoch is not a case to plan for).
        self._epoch = secrets.token_hex(6)
        self._lives = itertools.count()
        self.sessions: dict[str, Session] = {}
        self._lock = threading.RLock()
        self._keys_of: dict[str, _KeyNames] = {}
        # Aborted and discarded sessions leave memory; their ids are remembered (bounded) so a
        # late call gets "session is aborted" rather than "unknown session".
        self._gone: OrderedDict[str, str] = OrderedDict()
        self.gone_capacity = 100_000
        self.trained_tokens = 0
        """Tokens under a loss mask of 1 in every Segment handed over (``dressage_trained_tokens_total``)."""

    # ----------------------------------------------------------------- sessions
    def create_session(self, metadata: Mapping[str, Any] | None = None, session_id: str | None = None) -> Session:
        sid = session_id or secrets.token_urlsafe(18)  # unguessable: the id is the session's capability
        with self._lock:
            if sid in self.sessions or sid in self._gone:
                raise SessionStateError(f"session {sid} already exists"
                                        + (f" and is {self._gone[sid]}" if sid in self._gone else ""))
            session = Session(sid, metadata=dict(metadata or {}), r3_shape=self.config.r3_shape,
                              decode=self._decode, special_ids=self._special_ids)
            if self.journal is not None:
                self.journal.session_created(session)
            self.sessions[sid] = session
            self._keys_of[sid] = self._new_life()
        return session

    def session(self, session_id: str) -> Session:
        try:
            return self.sessions[session_id]
        except KeyError:
            gone = self._gone.get(session_id)
            if gone is not None:
                raise SessionStateError(f"session {session_id} is {gone}") from None
            raise UnknownSessionError(f"unknown session {session_id!r}") from None

    def state_of(self, session_id: str) -> str | None:
        """``active`` / ``finalized`` (in memory), ``aborted`` / ``discarded`` (gone), or ``None``."""
        s = self.sessions.get(session_id)
        return s.state if s is not None else self._gone.get(session_id)

    def _bury(self, session_id: str, state: str) -> None:
        """Drop a session from memory, remembering only that it is ``state`` (its end is journaled)."""
        with self._lock:
            self.sessions.pop(session_id, None)
            self._keys_of.pop(session_id, None)
            self._gone[session_id] = state
            self._gone.move_to_end(session_id)
            while len(self._gone) > self.gone_capacity:
                self._gone.popitem(last=False)

    def active_session(self, session_id: str) -> Session:
        s = self.session(session_id)
        if s.state != "active":
            raise SessionStateError(f"session {session_id} is {s.state}")
        return s

    # ------------------------------------------------------------------ calls
    def plan(self, session_id: str, prompt_ids: Any, *, tools: Any = None, boundary_reason: str | None = None,
             engine_moved: bool = False) -> RouteDecision:
        """The one Segment-boundary decision of a call, made before it goes to the engine.

        Where the step attaches (create / append / branch, which sets ``routed_experts_start_len``):
        a new Segment when the chat prompt is no exact extension (``boundary_reason``) or when the
        session's engine left the pool (``engine_moved``: the new engine recomputes the prefix, so
        one Segment's routing all comes from one engine); otherwise the session's prefix match.
        """
        self._settle(session_id)  # route against every step already answered
        session = self.active_session(session_id)
        if boundary_reason is not None:
            return RouteDecision("create", None, 0, Boundary(boundary_reason))
        decision = session.route(prompt_ids, tools=tools)
        if engine_moved and decision.parent_id is not None:
            parent = session.step(decision.parent_id)
            return RouteDecision("create", None, 0, Boundary("engine_failover", matched_tokens=parent.seq_len,
                                                             candidate_step=parent.step_id))
        return decision

    def generate_params(self, decision: RouteDecision) -> dict[str, Any]:
        """The SGLang ``/generate`` flags this call needs."""
        params: dict[str, Any] = {"return_logprob": True}
        if self.config.use_rollout_routing_replay:
            params["return_routed_experts"] = True
            params["routed_experts_start_len"] = int(decision.routed_experts_start)
        return params

    @property
    def routed_experts_spec(self) -> RoutedExpertsSpec | None:
        """What :meth:`normalize` decodes R3 into, for the engine client's decode as the body arrives."""
        return None if self._r3 is None else self._r3.spec

    def normalize(self, body: Mapping[str, Any], *, prompt_len: int, decision: RouteDecision) -> GenerateOutput:
        """Decode one ``/generate`` JSON body for this call (validates every length; R3 comes out
        range-checked in the storage dtype)."""
        routing = {} if self._r3 is None else self._r3.decode_options()
        return decode_generate_response(body, prompt_len=prompt_len, want_logprobs=True,
                                        routed_experts_start_len=decision.routed_experts_start, **routing)

    def ingest(self, session_id: str, decision: RouteDecision, body: Mapping[str, Any], *, prompt_ids: Any,
               version: int = 0, **step_kwargs: Any) -> StepRecord:
        """Normalise an engine response and record it through :meth:`begin_step`, waiting for the commit."""
        prompt = np.asarray(prompt_ids, dtype=np.int32)
        out = self.normalize(body, prompt_len=len(prompt), decision=decision)
        return self.begin_step(session_id, decision, prompt_ids=prompt, response_ids=out.output_ids,
                               logprobs=out.logprobs, routed_experts=out.routed_experts, token_versions=version,
                               routed_experts_checked=True, **step_kwargs).result()

    @property
    def writes_behind(self) -> bool:
        """Whether :meth:`begin_step` returns before the step's TQ write (offloaded fields, write-behind on)."""
        return self.write_behind.enabled and bool(self.config.offloaded)

    def begin_step(self, session_id: str, decision: RouteDecision, *, prompt_ids: Any, response_ids: Any,
                   logprobs: Any, routed_experts: Any = None, token_versions: Any = 0,
                   routed_experts_checked: bool = False, **step_kwargs: Any) -> PendingStep:
        """The commit region: validate and encode now, write offloaded fields to TQ, commit locally.

        Every error that can refuse the step (the expert-id range check for the storage dtype
        included) is raised here, before any byte is written. The offloaded fields then go to
        :attr:`write_behind`: behind the answer (the returned step's future resolves once the step
        is committed) or, with write-behind off, before this returns. The step joins the session
        (journal first) only once its keys are committed: if the TQ write fails nothing is
        committed, and if the local commit fails the keys already written are deleted, so neither
        side keeps half a step. Without offloaded fields the step is committed before this returns.
        ``routed_experts_checked``: the routing came out of :meth:`normalize` (range-checked into the
        storage dtype there), so an array already in that dtype is not checked again.
        """
        session = self.active_session(session_id)
        response = np.asarray(response_ids, dtype=np.int32)
        fields = self._encode(logprobs, routed_experts, checked=routed_experts_checked)
        names = self._offloaded_names(fields)
        with self._lock:
            # The one validation of the step; the commit only places it (see Session.rebase).
            rec = session.prepare_step(decision, prompt_ids=prompt_ids, response_ids=response,
                                       token_versions=token_versions, **fields, **step_kwargs)
        if not names:
            return done_step(self._commit(session, decision, rec, {}))
        items = [(n, np.ascontiguousarray(fields[n])) for n in names]
        return self.write_behind.submit(session_id, rec, items, self._keys(session_id, names), self._batch_tag(),
                                        lambda refs: self._commit(session, decision, rec, refs))

    def _encode(self, logprobs: Any, routed_experts: Any, *, checked: bool) -> dict[str, Any]:
        """The large fields as stored: float32 logprobs, and R3 range-checked in the storage dtype."""
        fields: dict[str, Any] = {"logprobs": None if logprobs is None else logprobs_array(logprobs)}
        if self._r3 is not None:
            fields["routed_experts"] = None if routed_experts is None else self._r3.encode(routed_experts,
                                                                                           checked=checked)
        elif routed_experts is not None:
            fields["routed_experts"] = routed_experts  # the session refuses it: Routing Replay is off
        return fields

    def _commit(self, session: Session, decision: RouteDecision, rec: StepRecord, refs: dict[str, Any]) -> StepRecord:
        """Record a validated step whose offloaded fields are stored under ``refs`` (journal first)."""
        if refs and self.renewal is not None:
            self.renewal.start()
        try:
            with self._lock:
                if session.state == "active" and self.sessions.get(session.session_id) is not session:
                    raise SessionStateError(f"session {session.session_id} was dropped; it takes no more steps")
                rec = session.rebase(rec, **refs)
                # Refused before it is journaled, under the lock that abort, discard and finalize journal
                # under: a step record after the session's end would make the journal unreplayable.
                session.check_insertable(rec)
                if self.journal is not None:
                    self.journal.step(session.session_id, decision, rec, session)  # durable before it is visible
                return session.insert_step(rec)
        except BaseException:
            self._delete_quietly(list(refs.values()))
            raise

    def _offloaded_names(self, fields: dict[str, Any]) -> list[str]:
        return [n for n in self.config.offloaded if fields.get(n) is not None]

    def _new_life(self) -> _KeyNames:
        """The key names of a session id's life starting now (under the lock)."""
        return _KeyNames(f"{self._epoch}-{next(self._lives)}")

    def _keys(self, session_id: str, names: list[str]) -> list[str]:
        with self._lock:
            return self._keys_of[session_id].next_call(session_id, names)

    def _delete_quietly(self, refs: list[Any]) -> None:
        if refs and self.tq is not None:
            try:
                self.tq.delete(refs)
            except DressageError:
                pass  # the unit is gone; retention clears what it held

    def held_keys(self) -> list[str]:
        """The TQ keys of every session held here (live, or finalized and not yet forgotten)."""
        keys: list[str] = []
        for s in list(self.sessions.values()):
            with self._lock:  # a step may be committing into it
                keys += _session_keys(s)
        return keys

    def held_bytes(self) -> dict[str, int]:
        """What this Proxy's StepRecords hold themselves: large-field arrays (refs count zero) and
        token fields, in bytes, and the number of steps."""
        large = tokens = steps = 0
        tapes: dict[int, int] = {}  # the steps of a lineage share one token buffer: count it once
        for s in list(self.sessions.values()):
            for st in list(s.steps.values()):
                steps += 1
                large += sum(v.nbytes for v in (st.logprobs, st.routed_experts) if isinstance(v, np.ndarray))
                tokens += st.token_versions.nbytes
                if st._tape is not None:
                    tapes[id(st._tape)] = st._tape.buf.nbytes
                else:
                    tokens += st.prompt_ids.nbytes + st.response_ids.nbytes
        tokens += sum(tapes.values())
        return {"large_fields": large, "token_fields": tokens, "steps": steps}

    async def settled(self, session_id: str) -> None:
        """Wait (without blocking the loop) for the session's steps still being written."""
        await self.write_behind.settled(session_id)

    def _settle(self, session_id: str) -> None:
        self.write_behind.wait(session_id)

    def close(self) -> None:
        """Write and commit every step still under way, stop renewing the held keys, then close the journal,
        which frees it for the next Proxy (the Proxy calls this when it stops)."""
        self.write_behind.close()
        if self.renewal is not None:
            self.renewal.close()
        if self.journal is not None:
            self.journal.close()

    # --------------------------------------------------------------- lifecycle
    def finalize(self, session_id: str, reward: float | None = None, *,
                 metadata: Mapping[str, Any] | None = None, allow_empty: bool = False) -> FinalizedSession:
        """Finalize, build Segments (no TQ reads), release refs no Segment uses, hand to the sink.

        ``metadata`` is merged into the session's (journaled with the finalize). The journal record is
        written first: when it fails the session is left active and unchanged. ``allow_empty``: a
        session without steps is finalized too (with no Segments) instead of refused.
        """
        self._settle(session_id)  # every step already answered is in the session first
        with self._lock:
            session = self.session(session_id)
            session.check_finalizable(allow_empty=allow_empty)
            reward = None if reward is None else float(reward)
            update = dict(metadata or {})
            fid = uuid.uuid4().hex  # journaled: a repeat of the finalize after a restart answers the same id
            if self.journal is not None:
                self.journal.finalized(session_id, reward, update or None, finalization_id=fid)
            session.metadata.update(update)
            session.finalize(reward, allow_empty=allow_empty, finalization_id=fid)
        return self._hand_over(self._cut(session))

    def _cut(self, session: Session) -> FinalizedSession:
        """A finalized session's Segments; the refs no Segment uses (dropped retry orphans) are deleted from
        TQ now and listed in ``released_refs``."""
        session_id = session.session_id
        # Chat histories and tool schemas are for routing calls, and none come any more; a Segment's
        # last step keeps its conversation, what an export or the viewer shows of the Segment.
        session.seal(keep=segment_ends(session, self.config.segment_view,
                                       drop_retry_orphans=self.config.drop_retry_orphans))
        segments = build_segments(session, self.config.segment_view,
                                  drop_retry_orphans=self.config.drop_retry_orphans,
                                  shared_prefix_loss=self.config.shared_prefix_loss)
        used = {id(p.value) for seg in segments for pieces in seg.large.values() for p in pieces
                if hasattr(p, "value")}
        unused = [r for r in session.large_field_refs() if id(r) not in used]
        self._delete_quietly(unused)
        metadata = dict(session.metadata)
        labels = {code: label for st in session.steps.values() for code, label in step_labels(st.metadata).items()}
        if labels:  # the engine's names of the session's named versions, for Sample.weight_versions
            metadata[VERSION_LABELS_KEY] = labels
        return FinalizedSession(session_id, segments, session.reward, metadata, unused,
                                finalization_id=session.finalization_id)

    def _hand_over(self, done: FinalizedSession, *, lost: int = 0) -> FinalizedSession:
        """Give ``done`` to the sink; ``lost``: how many of its keys the TransferQueue no longer holds."""
        if lost:  # its Samples' refs point at nothing: a reader must not take it as whole
            done.metadata[LOST_FIELDS_KEY] = lost
        self.trained_tokens += sum(int(np.count_nonzero(seg.loss_mask)) for seg in done.segments)
        if self.sink is not None:
            self.sink(done)
        return done

    def abort(self, session_id: str, reason: str = "aborted") -> int:
        """Abort a session, delete its TQ keys and forget it; returns how many refs were released."""
        with self._lock:
            session = self.session(session_id)
            session.check_abortable()
            if self.journal is not None:  # durable first: a failed write leaves the session as it was
                self.journal.aborted(session_id, reason)
            session.abort(reason)
        refs = session.large_field_refs()
        self._delete_quietly(refs)
        self._bury(session_id, "aborted")
        return len(refs)

    def discard(self, session_id: str) -> dict[str, Any]:
        """Drop a session, active or finalized, and every TQ key it holds; a repeat is a no-op.

        A finalized session's Samples are withdrawn from the sink too (``sink.discard``), so
        nothing trains on keys that are gone.
        """
        with self._lock:
            gone = self._gone.get(session_id)
            if session_id not in self.sessions and gone is not None:
                return {"session_id": session_id, "state": gone, "was": gone, "released_refs": 0, "samples": 0}
            session = self.session(session_id)
            was = session.state
            if self.journal is not None:  # durable first: a failed write leaves the session as it was
                if was == "active":
                    self.journal.aborted(session_id, "discarded")
                else:
                    self.journal.forgotten(session_id)
            if was == "active":
                session.abort("discarded")
        refs = session.large_field_refs()
        self._delete_quietly(refs)
        withdrawn = 0
        if was == "finalized" and hasattr(self.sink, "discard"):
            withdrawn = int(self.sink.discard(session_id) or 0)
        self._bury(session_id, "discarded")
        return {"session_id": session_id, "state": "discarded", "was": was, "released_refs": len(refs),
                "samples": withdrawn}

    def drop_unused(self, session_id: str) -> bool:
        """Forget an active session that recorded nothing (its first call failed), as if never created."""
        with self._lock:
            s = self.sessions.get(session_id)
            if s is None or s.state != "active" or s.steps or self.write_behind.futures(session_id):
                return False
            if self.journal is not None:
                self.journal.forgotten(session_id)
            del self.sessions[session_id]
            self._keys_of.pop(session_id, None)
        return True

    def forget(self, *session_ids: str, read_id: str | None = None) -> None:
        """Drop finished sessions from memory (their Segments live on in the RolloutManager, or with the
        trainer that acknowledged them), all or none: one journal record forgets them together, written
        before anything changes, so neither a failed write nor a crash leaves part of them forgotten. An
        active one is refused before anything is written. ``read_id``: the read whose ack forgets them,
        journaled with them. Their TQ keys are renewed once more as they leave: whoever holds them now has
        ``retention_s`` from this moment to restore them."""
        with self._lock:
            held = {sid: s for sid in dict.fromkeys(session_ids) if (s := self.sessions.get(sid)) is not None}
            active = [sid for sid, s in held.items() if s.state == "active"]
            if active:
                raise SessionStateError(f"session {active[0]} is still active")
            if held and self.journal is not None:
                self.journal.forgotten(*held, read_id=read_id)  # durable first: a failed write keeps them all
            for sid in held:
                del self.sessions[sid]
                self._keys_of.pop(sid, None)
        if held and self.renewal is not None:
            self.renewal.hand_off([key for s in held.values() for key in _session_keys(s)])

    def recover(self, path: Any, *, accept: Callable[[Any], None] | None = None) -> Any:
        """Replay a journal into this (empty) core: active sessions resume, finalized ones are
        delivered to the sink again (their Samples were not consumed yet), aborted ones are only
        remembered as aborted. ``accept(report)`` may refuse the replay (raise) before anything is
        taken. A session whose TQ keys the TransferQueue no longer holds is listed in
        ``report.lost_fields`` and carries ``metadata["large_fields_lost"]`` (how many keys): a finalized
        one is delivered with it, an active one gets it now and hands it to the Samples of its finalize."""
        from dressage.proxy.journal.log import Journal

        sessions, report = Journal.replay(path, decode=self._decode, special_ids=self._special_ids)
        if accept is not None:
            accept(report)
        with self._lock:
            for sid, s in sessions.items():
                if s.state == "aborted":
                    self._gone[sid] = "aborted"  # its keys were released when it was aborted
                    continue
                self.sessions[sid] = s
                self._keys_of[sid] = self._new_life()  # resumed: its new calls name keys of this start
        cut = [self._cut(self.sessions[sid]) for sid in report.finalized]
        # A finalized session's keys are those its Segments use: the others were released on purpose at
        # its finalize (dropped retry orphans), and are gone, not lost.
        named = {done.session_id: _kept_keys(self.sessions[done.session_id], done) for done in cut}
        named.update((sid, _session_keys(self.sessions[sid])) for sid in report.active)
        try:
            report.lost_fields = self._missing_keys(named)
        except DressageError as exc:  # the Controller did not answer: nothing is marked on a guess
            report.tq_check_error = f"{type(exc).__name__}: {exc}"
        if self.sessions and self.renewal is not None:
            self.renewal.start()  # what the replay brought back is held again
        for sid in report.active:  # its steps before the crash point at nothing: so will its Samples
            if sid in report.lost_fields:
                self.sessions[sid].metadata[LOST_FIELDS_KEY] = len(report.lost_fields[sid])
        report.delivered = [self._hand_over(done, lost=len(report.lost_fields.get(done.session_id, ())))
                            for done in cut]
        return report

    def _missing_keys(self, named: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        """Per session, the keys of ``named`` (session id -> its TQ keys) that the TransferQueue's directory
        no longer holds (a TQ that did not outlive the Proxy). Empty without TQ, or when the directory
        cannot be asked."""
        controller = getattr(self.tq, "controller", None) or getattr(self.tq, "_controller", None)
        where = getattr(controller, "where", None)
        if where is None:
            return {}
        named = {sid: sorted(set(ks)) for sid, ks in named.items()}
        keys = [k for ks in named.values() for k in ks]
        held: set[str] = set()
        for i in range(0, len(keys), _WHERE_CHUNK):  # bounded requests to the Controller
            held.update(where(keys[i:i + _WHERE_CHUNK]))
        return {sid: lost for sid, ks in named.items() if (lost := [k for k in ks if k not in held])}


def _session_keys(session: Session) -> list[str]:
    """The TQ keys a session's steps name."""
    return [r.key for r in session.large_field_refs() if hasattr(r, "key")]


def _kept_keys(session: Session, done: FinalizedSession) -> list[str]:
    """The TQ keys of a finalized session its Segments use (those its finalize released left out)."""
    released = {r.key for r in done.released_refs if hasattr(r, "key")}
    return [k for k in _session_keys(session) if k not in released]
