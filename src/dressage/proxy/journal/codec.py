"""Journal records: what one session event looks like on disk, and how replay applies it.

A payload is ``u8 kind, u32 len(session id), session id (UTF-8), msgpack body``, so compaction can
tell which session a record belongs to without decoding its body (a ``forget_many`` names its
sessions in its body). The kinds (``KINDS``):

- ``session`` (1): a session was created (metadata, R3 shape, whether it records logprobs);
- ``step`` (2): a committed StepRecord (below);
- ``finalize`` (3): reward, the metadata the finalize added, its finalization id;
- ``abort`` (4): the session was aborted (or discarded while active); replay remembers its id only;
- ``forget`` (5): one finished session was dropped (no body), outside a read's ack: a discard of a
  finalized session, a session that recorded nothing. A previous version also wrote one per session
  an ack forgot; such journals replay as they did;
- ``forget_many`` (6): finished sessions dropped together, in one record, so that a crash leaves all
  or none of them forgotten: the ack of a read (body ``{"ids": [...], "read": read id}``; a replay
  reports the read, so that a repeat of its ack after a restart answers what it forgot), or a batch
  the Proxy forgets itself (``"read": None``). Its prefix names no session (an empty id).

A session id that is used again after its session was forgotten (or aborted, once the Proxy stopped
remembering it) starts a new life with a new ``session`` record: replay, and compaction, leave the
first life at the record that ended it.

A step record stores only what is new: its prompt as ``(base step, n tokens)`` plus the ids after
them, its messages as ``(base step, k messages)`` plus the rest and its tools as a reference when they
equal the base step's. The base is the parent (append / branch) or the boundary's candidate step (a
new lineage that shares a prefix), so a session of N turns journals O(total tokens), not O(N * context).
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

import msgpack
import numpy as np

from dressage.errors import DressageError, JournalEncodeError, JournalError
from dressage.trajectory import Boundary, RouteDecision, Session, StepRecord

__all__ = ["JournalEncodeError", "KINDS", "encode", "split", "apply", "encode_session", "encode_step",
           "encode_forget", "ended", "acknowledged_read"]

_PREFIX = struct.Struct("<BI")
KINDS = {"session": 1, "step": 2, "finalize": 3, "abort": 4, "forget": 5, "forget_many": 6}
_NAMES = {v: k for k, v in KINDS.items()}


def _packb(body: Any) -> bytes:
    try:
        return msgpack.packb(body, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
        raise JournalEncodeError(f"cannot journal this value: {type(exc).__name__}: {exc}") from None


def encode(kind: str, session_id: str, body: Any) -> bytes:
    try:
        sid = session_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise JournalEncodeError(f"cannot journal session id: {exc}") from None
    return _PREFIX.pack(KINDS[kind], len(sid)) + sid + _packb(body)


def split(payload: bytes) -> tuple[str, str, memoryview]:
    """(kind, session id, body bytes) of a payload; JournalError when it is not one."""
    if len(payload) < _PREFIX.size:
        raise JournalError(f"record of {len(payload)} bytes is shorter than its prefix")
    code, n = _PREFIX.unpack_from(payload)
    if code not in _NAMES or _PREFIX.size + n > len(payload):
        raise JournalError(f"record has unknown kind {code} or a session id past its end")
    try:
        sid = bytes(payload[_PREFIX.size:_PREFIX.size + n]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JournalError(f"record session id is not UTF-8: {exc}") from None
    return _NAMES[code], sid, memoryview(payload)[_PREFIX.size + n:]


def _forgets(sid: str, raw: memoryview | bytes) -> tuple[list[str], str | None]:
    """The session ids and the read id of a ``forget_many`` body."""
    try:
        rec = msgpack.unpackb(raw, raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise JournalError(f"forget_many record: {type(exc).__name__}: {exc}") from None
    if sid or not isinstance(rec, dict):
        raise JournalError("forget_many record names a session in its prefix or has no map body")
    ids, read = rec.get("ids"), rec.get("read")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or not (
            read is None or isinstance(read, str)):
        raise JournalError("forget_many record: ids is not a list of session ids, or read is not a read id")
    return ids, read


def ended(kind: str, sid: str, body: memoryview | bytes) -> list[str]:
    """The sessions whose life a record of ``kind`` ends: a forget's, an abort's (replay remembers an aborted
    id only), every id of a ``forget_many``; none for another kind."""
    if kind == "forget_many":
        return _forgets(sid, body)[0]
    return [sid] if kind in ("forget", "abort") else []


def acknowledged_read(payload: bytes) -> tuple[str, list[str]] | None:
    """``(read id, session ids)`` of a record that forgot what an acknowledged read handed out; else ``None``."""
    kind, sid, body = split(payload)
    if kind != "forget_many":
        return None
    ids, read = _forgets(sid, body)
    return None if read is None else (read, ids)


# ----------------------------------------------------------------------- encode
def encode_forget(session_ids: Sequence[str], read_id: str | None = None) -> bytes:
    """One record that forgets ``session_ids`` together (``read_id``: the read whose ack forgets them). One
    session and no read is the ``forget`` record (the form a previous version reads too)."""
    ids = list(session_ids)
    if len(ids) == 1 and read_id is None:
        return encode("forget", ids[0], None)
    return encode("forget_many", "", {"ids": ids, "read": read_id})


def _arr(a: np.ndarray) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    return {"d": a.dtype.str, "s": list(a.shape), "b": a.tobytes()}


def _unarr(obj: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(obj["d"])
    if dtype.hasobject:
        raise JournalError("array record with an object dtype")
    return np.frombuffer(obj["b"], dtype=dtype).reshape(obj["s"]).copy()


def _value(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        return {"arr": _arr(v)}
    return {"ref": v.to_wire()}


def _unvalue(obj: Any) -> Any:
    if obj is None:
        return None
    if "arr" in obj:
        return _unarr(obj["arr"])
    from dressage.fields.refs import FieldRef

    return FieldRef.from_wire(obj["ref"])


def encode_session(session: Session) -> bytes:
    return encode("session", session.session_id, {
        "meta": session.metadata, "r3": list(session.r3_shape) if session.r3_shape else None,
        "lp": session.record_logprobs})


def _base(session: Session | None, decision: RouteDecision, rec: StepRecord) -> tuple[StepRecord | None, int]:
    """The earlier step this one shares a prompt prefix with, and the prefix length."""
    if session is None:
        return None, 0
    if rec.parent_id is not None and rec.parent_id in session.steps:
        base = session.steps[rec.parent_id]
        return base, base.seq_len
    b = rec.boundary or decision.boundary
    if b is not None and b.candidate_step is not None and b.candidate_step in session.steps and b.matched_tokens > 0:
        base = session.steps[b.candidate_step]
        n = min(int(b.matched_tokens), base.seq_len, rec.prompt_len)
        if np.array_equal(rec.prompt_ids[:n], base.full_ids[:n]):
            return base, n
    return None, 0


def encode_step(session_id: str, decision: RouteDecision, rec: StepRecord, session: Session | None = None) -> bytes:
    b = rec.boundary
    base, n = _base(session, decision, rec)
    body: dict[str, Any] = {
        "dec": [decision.kind, decision.parent_id, decision.routed_experts_start,
                None if decision.boundary is None else [decision.boundary.reason, decision.boundary.drift,
                                                        decision.boundary.matched_tokens,
                                                        decision.boundary.candidate_step]],
        "resp": _arr(rec.response_ids), "ver": _arr(rec.token_versions),
        "lp": _value(rec.logprobs), "re": _value(rec.routed_experts), "re0": rec.routed_experts_start,
        "br": None if b is None else b.reason, "meta": rec.metadata, "ts": rec.created_at,
        "id": rec.step_id,
    }
    body["pb"] = None if base is None else [base.step_id, n]
    body["prompt"] = _arr(rec.prompt_ids[n:])
    msgs, bm = rec.messages, None if base is None else base.messages
    if isinstance(msgs, list) and isinstance(bm, list) and bm and len(bm) <= len(msgs) and msgs[:len(bm)] == bm:
        body["mb"], body["msgs"] = [base.step_id, len(bm)], msgs[len(bm):]
    else:
        body["mb"], body["msgs"] = None, msgs
    if base is not None and rec.tools is not None and rec.tools == base.tools:
        body["tb"], body["tools"] = base.step_id, None
    else:
        body["tb"], body["tools"] = None, rec.tools
    return encode("step", session_id, body)


# ------------------------------------------------------------------------ apply
def apply(sessions: dict[str, Session], payload: bytes, *, decode=None, special_ids=(),
          forgotten: set[str] | None = None) -> str:
    """Apply one record to ``sessions``; returns its kind. Any record that does not fit (bad body,
    unknown session or step, a step the session refuses) is a :class:`JournalError`; the sessions
    are then unchanged. ``forgotten``: the ids whose life a ``forget`` ended (kept up to date here), so a
    step record behind one is :class:`EndedSessionStep`, not damage."""
    kind, sid, raw = split(payload)
    try:
        if kind == "forget_many":  # all of them at once: the record is one frame, intact or not replayed
            for gone in _forgets(sid, raw)[0]:
                sessions.pop(gone, None)
                if forgotten is not None:
                    forgotten.add(gone)
            return kind
        if kind == "step" and sid not in sessions and forgotten is not None and sid in forgotten:
            # Written by a Proxy that journaled a step before checking its session, which a read had
            # acknowledged (and forgotten) meanwhile: that Proxy refused the step and deleted its keys.
            raise EndedSessionStep(f"step record of session {sid!r}, which a read had acknowledged before it")
        rec = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        if not isinstance(rec, dict) and kind != "forget":
            raise JournalError(f"{kind} record body is a {type(rec).__name__}, not a map")
        if kind == "session":
            # An aborted id is remembered only; used again (once the Proxy stopped remembering it), it is a new life.
            if sid in sessions and sessions[sid].state != "aborted":
                raise JournalError(f"session {sid!r} is created twice")
            sessions[sid] = Session(sid, metadata=rec["meta"], r3_shape=tuple(rec["r3"]) if rec["r3"] else None,
                                    record_logprobs=rec["lp"], decode=decode, special_ids=special_ids)
            if forgotten is not None:
                forgotten.discard(sid)  # a new life: its steps are its own again
        elif kind == "step":
            _apply_step(sessions[sid], rec)
        elif kind == "finalize":
            s = sessions[sid]
            # Written only once the live finalize was allowed: one of a session whose first call was
            # still in flight finalized it without steps.
            s.check_finalizable(allow_empty=True)
            meta = rec.get("meta")
            if meta is not None:
                if not isinstance(meta, dict):
                    raise JournalError(f"finalize record for session {sid!r}: meta is not a map")
                s.metadata.update(meta)
            fid = rec.get("fid")
            if fid is not None and not isinstance(fid, str):
                raise JournalError(f"finalize record for session {sid!r}: fid is not a string")
            s.finalize(rec["reward"], allow_empty=True, finalization_id=fid)
        elif kind == "abort":
            sessions[sid].abort(rec["reason"])
        elif kind == "forget":
            sessions.pop(sid, None)
            if forgotten is not None:
                forgotten.add(sid)
    except JournalError:
        raise
    except KeyError as exc:
        raise JournalError(f"{kind} record for session {sid!r}: missing {exc}") from None
    except (DressageError, TypeError, ValueError, IndexError, AttributeError, OverflowError,
            msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise JournalError(f"{kind} record for session {sid!r}: {type(exc).__name__}: {exc}") from None
    return kind


class EndedSessionStep(JournalError):
    """A step record of a session that had ended (aborted, discarded or finalized) before it: the Proxy that
    wrote it had refused the step (its keys were deleted), so replay skips it rather than stopping there."""


def _apply_step(s: Session, rec: dict[str, Any]) -> None:
    if s.state != "active":  # journaled by a Proxy that did not yet check the session before the record
        raise EndedSessionStep(f"step record {rec.get('id')} of session {s.session_id!r}, which is {s.state}")
    kind, parent, start, bnd = rec["dec"]
    decision = RouteDecision(kind, parent, start, None if bnd is None else Boundary(*bnd))
    if rec["id"] != len(s.steps):
        raise JournalError(f"step record id {rec['id']} where session {s.session_id} has {len(s.steps)} steps")
    prompt = _unarr(rec["prompt"])
    if rec["pb"] is not None:
        base_id, n = rec["pb"]
        prompt = np.concatenate([s.step(base_id).full_ids[:n], prompt]).astype(np.int32)
    msgs = rec["msgs"]
    if rec["mb"] is not None:
        base_id, k = rec["mb"]
        msgs = list(s.step(base_id).messages[:k]) + list(msgs)
    tools = rec["tools"] if rec["tb"] is None else s.step(rec["tb"]).tools
    s.commit_step(decision, prompt_ids=prompt, response_ids=_unarr(rec["resp"]),
                  logprobs=_unvalue(rec["lp"]), routed_experts=_unvalue(rec["re"]),
                  routed_experts_start=rec["re0"], token_versions=_unarr(rec["ver"]),
                  messages=msgs, tools=tools, boundary_reason=rec["br"],
                  metadata=rec["meta"], created_at=rec["ts"])
