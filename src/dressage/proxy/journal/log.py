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
journal compacts itself: it copies the records a replay still needs (:class:`Lives`) to a new file
without blocking appends, then copies what was appended meanwhile under the lock and swaps the files.
A compacted journal replays to the sessions the one it replaced did (aborted ones without their steps,
which nothing reads); the acknowledged reads a replay reports do not outlive a compaction.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from dressage.errors import ConfigError, JournalEncodeError, JournalError, JournalFullError, JournalWriteError
from dressage.proxy.config import FSYNC_POLICIES
from dressage.proxy.journal import codec as codec
from dressage.proxy.journal.wal import FILE_MAGIC, HEADER, JournalDamage, Scan, frame, frames_after
from dressage.trajectory import RouteDecision, Session, StepRecord

__all__ = ["Journal", "JournalError", "JournalEncodeError", "JournalDamage", "ReplayReport", "FSYNC_POLICIES",
           "ABORTED_KEPT", "Lives"]

FILE_MODE = 0o600
ABORTED_KEPT = 100_000
"""Aborted session ids a compaction keeps the records of (the newest), so that a replay still remembers them
as aborted: as many as a ProxyCore remembers of the sessions that left it."""
READS_KEPT, READ_SESSIONS_KEPT = 10_000, 1_000_000
"""Acknowledged reads a replay reports (the newest, with at most so many session ids in all), so that an ack
repeated after a restart answers what it forgot: as many as the Proxy's read leases remember of ended reads."""


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
    acknowledged_reads: OrderedDict[str, list[str]] = field(default_factory=OrderedDict)
    """Reads whose ack the journal holds, oldest first (the newest ``READS_KEPT``, until a compaction drops
    them): read id -> the sessions that ack forgot."""

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
        lives = Lives()
        last_seq = 0
        for seq, payload, offset in scan:
            if intact_bytes is not None and scan.end > intact_bytes:
                break
            try:
                kind, sid, body = codec.split(payload)
                ends = codec.ended(kind, sid, body)
            except JournalError as exc:
                scan.stop(str(exc))
                break
            lives.add(offset, kind, sid, ends, HEADER + len(payload))
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
        self._lives = lives
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

    @property
    def live_bytes(self) -> int:
        return self._lives.live_bytes

    @property
    def size(self) -> int:
        return self._size

    # ------------------------------------------------------------------ write
    def _append(self, payload: bytes) -> None:
        kind, sid, body = codec.split(payload)
        ends = codec.ended(kind, sid, body)
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
            self._lives.add(self._size, kind, sid, ends, len(data))
            self._seq += 1
            self._size += len(data)
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

    def forgotten(self, *session_ids: str, read_id: str | None = None) -> None:
        """Forget finished sessions, all in one record: a crash leaves every one of them forgotten or none.
        ``read_id``: the read whose ack forgets them (a replay reports it, so that a repeat of the ack after
        a restart answers what it forgot)."""
        if session_ids:
            self._append(codec.encode_forget(session_ids, read_id))

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
        dead = self._lives.dead
        return dead > self.compact_min_bytes and dead > self.compact_ratio * self._lives.live_bytes

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
        """Rewrite the journal with only the records a replay needs (:meth:`Lives.needed`); returns its new
        size. What a replay of it gives is what a replay of the file it replaces gave."""
        with self._compacting:
            with self._lock:
                if self._closed:
                    raise JournalError(f"journal {self.path} is closed")
                cut, needed = self._size, self._lives.needed()
            tmp = self.path.with_name(self.path.name + ".compact")
            out = _open_private(tmp, os.O_WRONLY | os.O_TRUNC)
            try:
                _write_all(out, FILE_MAGIC)
                seq, size, lives = 0, len(FILE_MAGIC), Lives()
                seq, size = self._copy(out, 0, cut, seq, size, lives, keep=needed)
                with self._lock:
                    seq, size = self._copy(out, cut, self._size, seq, size, lives, keep=None)
                    os.fsync(out)
                    os.replace(tmp, self.path)
                    _fsync_dir(self.path)
                    old, self._fd = self._fd, out
                    out = -1
                    os.close(old)
                    os.lseek(self._fd, 0, os.SEEK_END)
                    self._seq, self._size, self._lives = seq, size, lives
                    self.compactions += 1
                    return size
            except OSError as exc:
                raise JournalError(f"cannot compact journal {self.path}: {exc}") from exc
            finally:
                if out >= 0:
                    os.close(out)
                    tmp.unlink(missing_ok=True)

    def _copy(self, out: int, start: int, stop: int, seq: int, size: int, lives: "Lives", *,
              keep: Callable[[int, str], bool] | None) -> tuple[int, int]:
        """Renumber and copy the records in ``[start, stop)`` (only those ``keep(offset, session id)`` says a
        replay needs, unless None), accounting them in ``lives`` at their offsets in the new file."""
        scan = Scan(self.path, start=start, stop=stop)
        for _, payload, offset in scan:
            kind, sid, body = codec.split(payload)
            if keep is not None and not keep(offset, sid):
                continue
            data = frame(seq + 1, payload)
            _write_all(out, data)
            lives.add(size, kind, sid, codec.ended(kind, sid, body), len(data))
            seq, size = seq + 1, size + len(data)
        if scan.damage is not None or scan.end != stop:
            raise JournalError(f"journal {self.path} changed under compaction: {scan.damage or scan.end}")
        return seq, size

    # ----------------------------------------------------------------- replay
    @staticmethod
    def replay(path: str | os.PathLike[str], *, decode=None, special_ids=()) -> tuple[dict[str, Session], ReplayReport]:
        """Rebuild sessions from the intact prefix of the journal (forgotten sessions are skipped)."""
        sessions: dict[str, Session] = {}
        ended: list[str] = []
        acks = _AckedReads()
        forgotten: set[str] = set()
        scan = Scan(path)
        for _, payload, _ in scan:
            try:
                if codec.apply(sessions, payload, decode=decode, special_ids=special_ids,
                               forgotten=forgotten) == "forget_many":
                    acks.note(codec.acknowledged_read(payload))
            except codec.EndedSessionStep:
                ended.append(codec.split(payload)[1])
            except JournalError as exc:
                scan.stop(str(exc))
        report = ReplayReport(records=scan.records, damage=scan.damage, duplicates=scan.duplicates,
                              truncated_tail=scan.damage is not None and scan.damage.kind == "torn_tail",
                              intact_bytes=scan.end, ended_steps=ended, acknowledged_reads=acks.reads)
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


class _AckedReads:
    """The acknowledged reads a replay found: the newest ``READS_KEPT``, with ``READ_SESSIONS_KEPT`` ids in all."""

    def __init__(self) -> None:
        self.reads: OrderedDict[str, list[str]] = OrderedDict()
        self._ids = 0

    def note(self, ack: tuple[str, list[str]] | None) -> None:
        if ack is None:
            return
        read_id, ids = ack
        self.reads[read_id] = ids
        self._ids += len(ids)
        while len(self.reads) > READS_KEPT or self._ids > READ_SESSIONS_KEPT:
            self._ids -= len(self.reads.popitem(last=False)[1])


class Lives:
    """What a replay of a journal still needs, record by record: compaction keeps exactly that.

    A session's current life starts at its ``session`` record and ends at a ``forget`` (or a ``forget_many``
    naming it): then none of its records are needed. An ``abort`` ends it too, but a replay remembers an
    aborted id, for which it needs that life's ``session`` and ``abort`` records (kept for the newest
    ``ABORTED_KEPT`` aborted ids). A record of an id whose life ended is needed by nothing: a drained session
    id used again starts a new life at its new ``session`` record, and its first life never comes back.
    ``live_bytes`` counts the bytes needed, ``dead`` those not.
    """

    def __init__(self) -> None:
        self._life: dict[str, list[int]] = {}
        """Session id -> [offset of its current life's session record, that record's bytes, the life's bytes]."""
        self._aborted: OrderedDict[str, tuple[int, int, int]] = OrderedDict()
        """Aborted id -> (offset of its session record, offset of its abort record, their bytes), oldest first."""
        self.live_bytes = 0
        self.dead = 0

    def add(self, offset: int, kind: str, sid: str, ends: Iterable[str], nbytes: int) -> None:
        """Account the record at ``offset`` (``ends``: the sessions whose life it ends, :func:`codec.ended`)."""
        if kind == "session":
            self._end(sid)  # an aborted id used again (or an id created twice): its earlier life is needed by nothing
            self._life[sid] = [offset, nbytes, nbytes]
            self.live_bytes += nbytes
            return
        ends = list(ends)
        if not ends:
            life = self._life.get(sid)
            if life is None:
                self.dead += nbytes
            else:
                life[2] += nbytes
                self.live_bytes += nbytes
            return
        lives = [self._end(gone) for gone in ends]
        if kind == "abort" and lives[0] is not None:  # remembered as aborted: its session record and this one
            start, head, _ = lives[0]
            self.dead -= head
            self.live_bytes += head + nbytes
            self._aborted[sid] = (start, offset, head + nbytes)
            while len(self._aborted) > ABORTED_KEPT:
                self._forget_aborted(next(iter(self._aborted)))
        else:
            self.dead += nbytes

    def _end(self, sid: str) -> list[int] | None:
        """End ``sid``'s life (and its memory as aborted): its bytes are dead now. Returns the life ended."""
        if sid in self._aborted:
            self._forget_aborted(sid)
        life = self._life.pop(sid, None)
        if life is not None:
            self.live_bytes -= life[2]
            self.dead += life[2]
        return life

    def _forget_aborted(self, sid: str) -> None:
        _, _, nbytes = self._aborted.pop(sid)
        self.live_bytes -= nbytes
        self.dead += nbytes

    def needed(self) -> Callable[[int, str], bool]:
        """Whether a replay needs the record at ``offset`` of session ``sid`` (as accounted so far)."""
        starts = {sid: life[0] for sid, life in self._life.items()}
        aborted = {sid: (start, end) for sid, (start, end, _) in self._aborted.items()}

        def keep(offset: int, sid: str) -> bool:
            start = starts.get(sid)
            if start is not None:
                return offset >= start
            return offset in aborted.get(sid, ())

        return keep
