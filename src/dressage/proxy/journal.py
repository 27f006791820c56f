"""An append-only msgpack journal of the Proxy's sessions, replayed on restart.

Every committed StepRecord is written before it becomes visible: resident fields as raw bytes,
TQ fields as FieldRef wire forms. After a crash the Proxy replays the journal: sessions in flight
come back active (resumable), finalized ones come back finalized, aborted ones stay aborted.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from dressage.errors import ConfigError, JournalError
from dressage.trajectory import Boundary, RouteDecision, Session, StepRecord

__all__ = ["Journal", "JournalError", "ReplayReport", "FSYNC_POLICIES"]

FSYNC_POLICIES = ("always", "interval", "never")
_VERSION = 1


def _arr(a: np.ndarray) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    return {"d": a.dtype.str, "s": list(a.shape), "b": a.tobytes()}


def _unarr(obj: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(obj["b"], dtype=np.dtype(obj["d"])).reshape(obj["s"]).copy()


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
    from dressage.tq.refs import FieldRef

    return FieldRef.from_wire(obj["ref"])


@dataclass(slots=True)
class ReplayReport:
    records: int = 0
    active: list[str] = field(default_factory=list)
    finalized: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    truncated_tail: bool = False
    delivered: list[Any] = field(default_factory=list)
    """FinalizedSessions handed to the sink again by ``ProxyCore.recover``."""


class Journal:
    """``append`` is thread-safe; ``fsync`` is ``always`` (each record), ``interval`` or ``never``."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: str = "always", fsync_interval_s: float = 1.0) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ConfigError(f"journal.fsync: expected one of {', '.join(FSYNC_POLICIES)}, got {fsync!r}")
        self.path = Path(path)
        self.fsync, self.fsync_interval_s = fsync, float(fsync_interval_s)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = open(self.path, "ab")
        self._last_sync = time.monotonic()

    # ------------------------------------------------------------------ write
    def _append(self, record: dict[str, Any]) -> None:
        data = msgpack.packb({"v": _VERSION, **record}, use_bin_type=True)
        with self._lock:
            try:
                self._file.write(data)
                self._file.flush()
                now = time.monotonic()
                if self.fsync == "always" or (self.fsync == "interval" and now - self._last_sync >= self.fsync_interval_s):
                    os.fsync(self._file.fileno())
                    self._last_sync = now
            except (OSError, ValueError) as exc:  # ValueError: the file was closed under us
                raise JournalError(f"cannot append to journal {self.path}: {exc}") from exc

    def session_created(self, session: Session) -> None:
        self._append({"t": "session", "sid": session.session_id, "meta": session.metadata,
                      "r3": list(session.r3_shape) if session.r3_shape else None,
                      "lp": session.record_logprobs})

    def step(self, session_id: str, decision: RouteDecision, rec: StepRecord) -> None:
        b = rec.boundary
        self._append({
            "t": "step", "sid": session_id,
            "dec": [decision.kind, decision.parent_id, decision.routed_experts_start,
                    None if decision.boundary is None else [decision.boundary.reason, decision.boundary.drift,
                                                            decision.boundary.matched_tokens,
                                                            decision.boundary.candidate_step]],
            "prompt": _arr(rec.prompt_ids), "resp": _arr(rec.response_ids), "ver": _arr(rec.token_versions),
            "lp": _value(rec.logprobs), "re": _value(rec.routed_experts), "re0": rec.routed_experts_start,
            "br": None if b is None else b.reason, "msgs": rec.messages, "tools": rec.tools,
            "meta": rec.metadata, "ts": rec.created_at,
        })

    def finalized(self, session_id: str, reward: float | None) -> None:
        self._append({"t": "finalize", "sid": session_id, "reward": reward})

    def aborted(self, session_id: str, reason: str) -> None:
        self._append({"t": "abort", "sid": session_id, "reason": reason})

    def forgotten(self, session_id: str) -> None:
        self._append({"t": "forget", "sid": session_id})

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()

    # ----------------------------------------------------------------- replay
    @staticmethod
    def records(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], bool]:
        """Every whole record, and whether a torn last record (a crash mid-write) was dropped."""
        p = Path(path)
        if not p.exists():
            return [], False
        data = p.read_bytes()
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(data)
        out = []
        try:
            for rec in unpacker:
                if not isinstance(rec, dict) or rec.get("v") != _VERSION:
                    what = rec.get("v") if isinstance(rec, dict) else type(rec).__name__
                    raise JournalError(f"journal {p}: record of unknown version {what!r}")
                out.append(rec)
        except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
            raise JournalError(f"journal {p} is corrupt after {len(out)} records: {exc}") from exc
        return out, unpacker.tell() < len(data)

    @staticmethod
    def replay(path: str | os.PathLike[str], *, decode=None, special_ids=()) -> tuple[dict[str, Session], ReplayReport]:
        """Rebuild sessions from the journal (forgotten sessions are skipped)."""
        sessions: dict[str, Session] = {}
        records, torn = Journal.records(path)
        report = ReplayReport(truncated_tail=torn)
        for rec in records:
            report.records += 1
            t, sid = rec["t"], rec["sid"]
            if t == "session":
                sessions[sid] = Session(sid, metadata=rec["meta"], r3_shape=tuple(rec["r3"]) if rec["r3"] else None,
                                        record_logprobs=rec["lp"], decode=decode, special_ids=special_ids)
            elif t == "step":
                kind, parent, start, bnd = rec["dec"]
                decision = RouteDecision(kind, parent, start, None if bnd is None else Boundary(*bnd))
                s = sessions[sid]
                s.commit_step(decision, prompt_ids=_unarr(rec["prompt"]), response_ids=_unarr(rec["resp"]),
                              logprobs=_unvalue(rec["lp"]), routed_experts=_unvalue(rec["re"]),
                              routed_experts_start=rec["re0"], token_versions=_unarr(rec["ver"]),
                              messages=rec["msgs"], tools=rec["tools"], boundary_reason=rec["br"],
                              metadata=rec["meta"], created_at=rec["ts"])
            elif t == "finalize":
                sessions[sid].finalize(rec["reward"])
            elif t == "abort":
                sessions[sid].abort(rec["reason"])
            elif t == "forget":
                sessions.pop(sid, None)
        for sid, s in sessions.items():
            {"active": report.active, "finalized": report.finalized, "aborted": report.aborted}[s.state].append(sid)
        return sessions, report
