"""The Proxy journal: a write-ahead log of its sessions, replayed on restart.

Every committed StepRecord is written before it becomes visible: resident fields as raw bytes,
TQ fields as FieldRef wire forms. After a crash the Proxy replays the journal: sessions in flight
come back active (resumable), finalized ones come back finalized, aborted ones stay aborted.

Records are framed by :mod:`dressage.proxy.journal.wal` (length, sequence number, CRC32C). Replay streams
the file one record at a time and stops at the first damage (a torn tail, a flipped byte, a gap):
the intact prefix is recovered and the damage is reported in :class:`ReplayReport`, never raised.
Opening a journal for append cuts it back to its intact prefix first (bytes past a damage other than
a torn tail are kept beside it as ``PATH.damaged-OFFSET``), so new records are never written after
garbage. Files are created 0600. When the records of forgotten sessions outweigh the live ones the
journal compacts itself: it copies the live records to a new file without blocking appends, then
copies what was appended meanwhile under the lock and swaps the files.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dressage.errors import ConfigError, JournalEncodeError, JournalError, JournalFullError, JournalWriteError
from dressage.proxy.config import FSYNC_POLICIES
from dressage.proxy.journal import codec as codec
from dressage.proxy.journal.wal import FILE_MAGIC, HEADER, JournalDamage, Scan, frame, frames_after
from dressage.trajectory import RouteDecision, Session, StepRecord

__all__ = ["Journal", "JournalError", "JournalEncodeError", "JournalDamage", "ReplayReport", "FSYNC_POLICIES"]

FILE_MODE = 0o600


@dataclass(slots=True)
class ReplayReport:
    records: int = 0
    active: list[str] = field(default_factory=list)
    finalized: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    truncated_tail: bool = False
    """The journal ended in a torn record (a crash mid-write): it was dropped."""
    damage: JournalDamage | None = None
    """Where the intact prefix ends, when the journal does not replay to its end."""
    duplicates: int = 0
    """Exact copies of earlier records that were skipped."""
    intact_bytes: int = 0
    delivered: list[Any] = field(default_factory=list)
    """FinalizedSessions handed to the sink again by ``ProxyCore.recover``."""
    records_after_damage: int = 0
    """Well-formed records past a damage other than a torn tail: what starting on the prefix drops."""
    sessions_after_damage: list[str] = field(default_factory=list)
    """The sessions those records belong to."""
    set_aside: str | None = None
    """Where the bytes past the damage were kept when the Proxy started on the intact prefix."""
    lost_fields: dict[str, list[str]] = field(default_factory=dict)
    """Sessions (finalized or active) whose TQ keys the TransferQueue no longer holds: session id -> keys."""
    tq_check_error: str | None = None
    """Why the TransferQueue could not be asked which keys it holds (nothing was marked then)."""
    ended_steps: list[str] = field(default_factory=list)
    """Step records skipped because their session had ended before them (a session id per record): an
    older Proxy journaled a step it then refused, as its session was aborted, discarded or finalized."""

    @property
    def mid_journal_damage(self) -> bool:
        """Damaged before its end: intact records may lie past the damage (a torn tail is a crash mid-write)."""
        return self.damage is not None and not self.truncated_tail

    def damage_text(self) -> str:
        """The damage, with what lies after it."""
        d = self.damage
        if d is None:
            return "intact"
        return (f"{d.kind} at byte {d.offset} ({d.detail}); {self.records} records before it replay; "
                f"{self.records_after_damage} intact records of {len(self.sessions_after_damage)} sessions "
                f"({d.dropped_bytes} bytes) lie after it")

    def summary(self) -> str:
        text = (f"{self.records} records: {len(self.active)} sessions active, {len(self.finalized)} finalized, "
                f"{len(self.aborted)} aborted")
        if self.duplicates:
            text += f"; {self.duplicates} duplicated records skipped"
        if self.damage is not None:
            text += f"; {self.damage_text()}"
        if self.set_aside is not None:
            text += f"; the bytes after it were set aside in {self.set_aside}"
        if self.tq_check_error is not None:
            text += f"; the TransferQueue could not be asked for the journal's keys ({self.tq_check_error})"
        if self.lost_fields:
            text += (f"; {len(self.lost_fields)} sessions name TQ keys the TransferQueue no longer "
                     "holds (their large fields are lost)")
        if self.ended_steps:
            text += f"; {self.ended_steps_text()}"
        return text

    def ended_steps_text(self) -> str:
        """The step records skipped as their session had ended, and whose."""
        sessions = list(dict.fromkeys(self.ended_steps))
        return (f"{len(self.ended_steps)} step records of {len(sessions)} sessions that had ended before them "
                f"were skipped (never recorded: {', '.join(sessions[:5])}{', ...' if len(sessions) > 5 else ''})")


def _own(path: Path) -> int:
    """Hold the journal for this process (an exclusive ``flock`` on ``PATH.lock``, a file of its own so that
    a compaction's new journal file stays held): a second Proxy, or ``journal repair`` beside a running one,
    would write over the frames of the first and lose what it acknowledged. Closing the fd releases it."""
    fd = _open_private(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JournalError(f"journal {path} is in use by another process (a running Proxy, or a journal tool): "
                           "a journal belongs to one Proxy; stop that one first") from None
    return fd


def _open_private(path: Path, flags: int) -> int:
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return fd


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_error(path: Path, exc: OSError) -> JournalWriteError:
    """The typed error of a failed append: a full disk (507) or another I/O error (503)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return JournalFullError(f"cannot append to journal {path}: the disk is full ({exc.strerror or exc}); "
                                "nothing was changed")
    return JournalWriteError(f"cannot append to journal {path}: {exc}; nothing was changed")


class Journal:
    """``append`` is thread-safe; ``fsync`` is ``always`` (each record), ``interval`` or ``never``.

    ``compact_min_bytes`` / ``compact_ratio``: compact once the bytes of forgotten sessions exceed
    both ``compact_min_bytes`` and ``compact_ratio`` times the live bytes (``None`` never compacts
    on its own; :meth:`compact` always can). ``intact_bytes`` (from a :class:`ReplayReport`) cuts the
    file there instead of at the end of its framing-intact prefix.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: str = "always", fsync_interval_s: float = 1.0,
                 compact_min_bytes: int | None = 64 << 20, compact_ratio: float = 1.0,
                 intact_bytes: int | None = None) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ConfigError(f"journal.fsync: expected one of {', '.join(FSYNC_POLICIES)}, got {fsync!r}")
        self.path = Path(path)
        self.fsync, self.fsync_interval_s = fsync, float(fsync_interval_s)
        self.compact_min_bytes, self.compact_ratio = compact_min_bytes, float(compact_ratio)
        self._lock = threading.Lock()
        self._compacting = threading.Lock()
        self._compactor: threading.Thread | None = None
        self.compactions = 0
        self.fsyncs = 0
        """Appends' fsyncs."""
        self.observe_fsync: Callable[[float], None] | None = None
        """Told the seconds of each append's fsync (the ``dressage_journal_fsync_seconds`` histogram)."""
        self.compaction_error: BaseException | None = None
        self._closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._owner = _own(self.path)  # before the scan, which may cut the file back to its intact prefix
        except OSError as exc:
            raise JournalError(f"cannot open journal {self.path}: {exc}") from exc
        try:
            self.damage_found = self._open(intact_bytes)
        except BaseException as exc:
            os.close(self._owner)
            if isinstance(exc, OSError):
                raise JournalError(f"cannot open journal {self.path}: {exc}") from exc
            raise
        self._last_sync = time.monotonic()

    # ------------------------------------------------------------------- open
    def _open(self, intact_bytes: int | None) -> JournalDamage | None:
        scan = Scan(self.path)
        live: dict[str, int] = {}
        dead = last_seq = 0
        for seq, payload, _ in scan:
            if intact_bytes is not None and scan.end > intact_bytes:
                break
            try:
                kind, sid, _ = codec.split(payload)
            except JournalError as exc:
                scan.stop(str(exc))
                break
            dead += self._account(live, kind, sid, HEADER + len(payload))
            last_seq = seq
        if scan.damage is not None and scan.damage.kind == "not_a_journal":
            raise JournalError(f"{self.path} is not a Dressage journal ({scan.damage.detail}); move it away, "
                               f"or run `dressage proxy journal repair {self.path}` to set it aside")
        end = scan.end if intact_bytes is None else min(scan.end, intact_bytes)
        self._fd = _open_private(self.path, os.O_RDWR)
        size = os.fstat(self._fd).st_size
        self.set_aside: Path | None = None
        if end < size:
            torn = scan.damage is not None and scan.damage.kind == "torn_tail" and scan.damage.offset == end
            if not torn:
                self.set_aside = self._save_aside(end, size)
            os.ftruncate(self._fd, end)
            os.fsync(self._fd)
        if end == 0:
            _write_all(self._fd, FILE_MAGIC)
            os.fsync(self._fd)
            _fsync_dir(self.path)
            end = len(FILE_MAGIC)
        os.lseek(self._fd, 0, os.SEEK_END)
        self._size, self._seq = end, last_seq
        self._live, self._dead = live, dead
        return scan.damage

    def _save_aside(self, start: int, end: int) -> Path:
        aside = self.path.with_name(f"{self.path.name}.damaged-{start}")
        out = _open_private(aside, os.O_WRONLY | os.O_TRUNC)
        try:
            os.lseek(self._fd, start, os.SEEK_SET)
            while start < end:
                chunk = os.read(self._fd, min(1 << 20, end - start))
                if not chunk:
                    break
                _write_all(out, chunk)
                start += len(chunk)
            os.fsync(out)
        finally:
            os.close(out)
        return aside

    @staticmethod
    def _account(live: dict[str, int], kind: str, sid: str, nbytes: int) -> int:
        """Add one record to the live bytes; returns the bytes that became dead."""
        if kind in ("forget", "abort"):  # an aborted session is gone: replay only remembers its id
            return live.pop(sid, 0) + nbytes
        live[sid] = live.get(sid, 0) + nbytes
        return 0

    @property
    def live_bytes(self) -> int:
        return sum(self._live.values())

    @property
    def size(self) -> int:
        return self._size

    # ------------------------------------------------------------------ write
    def _append(self, payload: bytes) -> None:
        kind, sid, _ = codec.split(payload)
        with self._lock:
            if self._closed:
                raise JournalError(f"cannot append to journal {self.path}: it is closed")
            data = frame(self._seq + 1, payload)
            try:
                _write_all(self._fd, data)
                now = time.monotonic()
                if self.fsync == "always" or (self.fsync == "interval" and now - self._last_sync >= self.fsync_interval_s):
                    os.fsync(self._fd)
                    self._last_sync = time.monotonic()
                    self.fsyncs += 1
                    if self.observe_fsync is not None:
                        self.observe_fsync(self._last_sync - now)
            except OSError as exc:
                # A partial frame may be on disk: cut it so the next append starts clean.
                try:
                    os.ftruncate(self._fd, self._size)
                except OSError:
                    pass
                raise _write_error(self.path, exc) from exc
            self._seq += 1
            self._size += len(data)
            self._dead += self._account(self._live, kind, sid, len(data))
            due = self._compaction_due()
        if due:
            self._compact_in_background()

    def session_created(self, session: Session) -> None:
        self._append(codec.encode_session(session))

    def step(self, session_id: str, decision: RouteDecision, rec: StepRecord, session: Session | None = None) -> None:
        """``session`` (holding the earlier steps) lets the record store only the new tokens."""
        self._append(codec.encode_step(session_id, decision, rec, session))

    def finalized(self, session_id: str, reward: float | None, metadata: dict[str, Any] | None = None, *,
                  finalization_id: str | None = None) -> None:
        """``metadata``: keys the finalize adds to the session's metadata (``instance_id``, ``label``);
        ``finalization_id``: the finalize's id, which a replay keeps."""
        body: dict[str, Any] = {"reward": reward}
        if metadata:
            body["meta"] = metadata
        if finalization_id is not None:
            body["fid"] = finalization_id
        self._append(codec.encode("finalize", session_id, body))

    def aborted(self, session_id: str, reason: str) -> None:
        self._append(codec.encode("abort", session_id, {"reason": reason}))

    def forgotten(self, session_id: str) -> None:
        self._append(codec.encode("forget", session_id, None))

    def close(self) -> None:
        t = self._compactor
        if t is not None:
            t.join()
        with self._lock:
            if not self._closed:
                self._closed = True
                try:
                    os.fsync(self._fd)
                finally:
                    os.close(self._fd)
                    os.close(self._owner)  # the journal is free for the next Proxy

    # ------------------------------------------------------------- compaction
    def _compaction_due(self) -> bool:
        if self.compact_min_bytes is None or self._compacting.locked():
            return False
        return self._dead > self.compact_min_bytes and self._dead > self.compact_ratio * self.live_bytes

    def _compact_in_background(self) -> None:
        def run() -> None:
            try:
                self.compact()
            except BaseException as exc:  # kept for the caller; the old file stays intact
                self.compaction_error = exc

        t = threading.Thread(target=run, name="journal-compact", daemon=True)
        self._compactor = t
        t.start()

    def wait_compaction(self) -> None:
        t = self._compactor
        if t is not None:
            t.join()

    def compact(self) -> int:
        """Rewrite the journal with only the records of sessions not forgotten; returns its new size."""
        with self._compacting:
            with self._lock:
                if self._closed:
                    raise JournalError(f"journal {self.path} is closed")
                cut, live = self._size, set(self._live)
            tmp = self.path.with_name(self.path.name + ".compact")
            out = _open_private(tmp, os.O_WRONLY | os.O_TRUNC)
            try:
                _write_all(out, FILE_MAGIC)
                seq, size, new_live = 0, len(FILE_MAGIC), {}
                seq, size, _ = self._copy(out, 0, cut, seq, size, new_live, keep=live)
                with self._lock:
                    seq, size, dead = self._copy(out, cut, self._size, seq, size, new_live, keep=None)
                    os.fsync(out)
                    os.replace(tmp, self.path)
                    _fsync_dir(self.path)
                    old, self._fd = self._fd, out
                    out = -1
                    os.close(old)
                    os.lseek(self._fd, 0, os.SEEK_END)
                    self._seq, self._size, self._live, self._dead = seq, size, new_live, dead
                    self.compactions += 1
                    return size
            except OSError as exc:
                raise JournalError(f"cannot compact journal {self.path}: {exc}") from exc
            finally:
                if out >= 0:
                    os.close(out)
                    tmp.unlink(missing_ok=True)

    def _copy(self, out: int, start: int, stop: int, seq: int, size: int, live: dict[str, int], *,
              keep: set[str] | None) -> tuple[int, int, int]:
        """Renumber and copy the records in ``[start, stop)`` (only sessions in ``keep`` unless None)."""
        dead = 0
        scan = Scan(self.path, start=start, stop=stop)
        for _, payload, _ in scan:
            kind, sid, _ = codec.split(payload)
            if keep is not None and (sid not in keep or kind == "forget"):
                continue
            data = frame(seq + 1, payload)
            _write_all(out, data)
            seq, size = seq + 1, size + len(data)
            dead += self._account(live, kind, sid, len(data))
        if scan.damage is not None or scan.end != stop:
            raise JournalError(f"journal {self.path} changed under compaction: {scan.damage or scan.end}")
        return seq, size, dead

    # ----------------------------------------------------------------- replay
    @staticmethod
    def replay(path: str | os.PathLike[str], *, decode=None, special_ids=()) -> tuple[dict[str, Session], ReplayReport]:
        """Rebuild sessions from the intact prefix of the journal (forgotten sessions are skipped)."""
        sessions: dict[str, Session] = {}
        ended: list[str] = []
        scan = Scan(path)
        for _, payload, _ in scan:
            try:
                codec.apply(sessions, payload, decode=decode, special_ids=special_ids)
            except codec.EndedSessionStep:
                ended.append(codec.split(payload)[1])
            except JournalError as exc:
                scan.stop(str(exc))
        report = ReplayReport(records=scan.records, damage=scan.damage, duplicates=scan.duplicates,
                              truncated_tail=scan.damage is not None and scan.damage.kind == "torn_tail",
                              intact_bytes=scan.end, ended_steps=ended)
        if report.mid_journal_damage and scan.damage.kind != "not_a_journal":
            after: dict[str, None] = {}
            for payload in frames_after(path, scan.damage.offset):
                report.records_after_damage += 1
                try:
                    after[codec.split(payload)[1]] = None
                except JournalError:
                    continue
            report.sessions_after_damage = list(after)
        for sid, s in sessions.items():
            {"active": report.active, "finalized": report.finalized, "aborted": report.aborted}[s.state].append(sid)
        return sessions, report
