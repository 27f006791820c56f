"""Write-ahead-log framing of the Proxy journal: length, sequence number and CRC32C per record.

File layout::

    b"DRSJWAL2"                                   file magic (8 bytes)
    frame*                                        one per record
    frame  = header(22) payload(length)
    header = b"\\xd5J" u32 length  u64 seq  u32 crc32c(payload)  u32 crc32c(header[0:18])   (little-endian)

Sequence numbers start at 1 and grow by one. A scan stops at the first damage and reports it as a
:class:`JournalDamage` with the offset where the intact prefix ends. A *torn tail* is what a crash
leaves at the end: a last frame cut short (killed mid-write), or a last frame whose bytes turn into
zeros that run to the end of the file from where a block starts, or whole (a power loss after the file's
size reached the disk and before its last blocks did); nothing intact can follow either. An exact copy of a recent
record (same sequence number and checksum) is a *duplicate*: counted and skipped. Nothing is read
whole: a scan holds one record at a time, so a journal of any size replays in bounded memory.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from dressage.errors import JournalError

__all__ = ["FILE_MAGIC", "HEADER", "JournalDamage", "Scan", "count_frames_after", "crc32c", "frames_after", "frame",
           "DAMAGE_KINDS"]

FILE_MAGIC = b"DRSJWAL2"
_FRAME_MAGIC = b"\xd5J"
_HEAD = struct.Struct("<2sIQI")          # magic, length, seq, payload crc
_HCRC = struct.Struct("<I")
HEADER = _HEAD.size + _HCRC.size          # 22 bytes
MAX_RECORD = 2**32 - 1
_DUP_WINDOW = 4096                        # recent (seq -> crc) kept to recognise a duplicated record
BLOCK = 512                               # the smallest unit a disk writes: lost blocks read as zeros from one

DAMAGE_KINDS = ("torn_tail", "not_a_journal", "bad_header", "bad_checksum", "sequence_gap", "bad_record")

try:  # hardware CRC32C when the package is installed (a core dependency)
    from crc32c import crc32c as _crc32c_impl
except ImportError:  # pragma: no cover - exercised only where the package is missing
    _crc32c_impl = None

_TABLE: list[int] = []


def _crc32c_py(data: bytes | memoryview, crc: int = 0) -> int:
    """Bitwise-reflected CRC32C (Castagnoli, polynomial 0x82F63B78): the package's fallback."""
    if not _TABLE:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _TABLE.append(c)
    crc ^= 0xFFFFFFFF
    table = _TABLE
    for b in bytes(data):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def crc32c(data: bytes | memoryview, crc: int = 0) -> int:
    if _crc32c_impl is not None:
        return _crc32c_impl(data, crc)
    return _crc32c_py(data, crc)


def frame(seq: int, payload: bytes) -> bytes:
    """One framed record."""
    if len(payload) > MAX_RECORD:
        raise JournalError(f"journal record of {len(payload)} bytes is over the {MAX_RECORD}-byte frame limit")
    head = _HEAD.pack(_FRAME_MAGIC, len(payload), seq, crc32c(payload))
    return head + _HCRC.pack(crc32c(head)) + payload


@dataclass(frozen=True, slots=True)
class JournalDamage:
    """Where and how a journal stops being intact. Records before ``offset`` are recovered."""

    kind: str
    offset: int
    """Byte offset where the intact prefix ends (the damaged frame starts here)."""
    detail: str
    intact_records: int
    last_seq: int
    file_bytes: int

    @property
    def dropped_bytes(self) -> int:
        return self.file_bytes - self.offset

    def to_dict(self) -> dict:
        return {**asdict(self), "dropped_bytes": self.dropped_bytes}

    def __str__(self) -> str:
        return (f"{self.kind} at byte {self.offset} after {self.intact_records} intact records "
                f"(last seq {self.last_seq}): {self.detail}; {self.dropped_bytes} bytes not recovered")


class Scan:
    """Iterate ``(seq, payload, offset)`` over the intact prefix of a journal file.

    After iteration: ``end`` (bytes of the intact prefix), ``records``, ``last_seq``,
    ``duplicates`` (skipped exact copies), ``damage`` (None when the whole file is intact).
    The caller may end the prefix earlier with :meth:`stop` (a record it cannot use).
    """

    def __init__(self, path: str | os.PathLike[str], *, start: int = 0, stop: int | None = None) -> None:
        self.path = Path(path)
        self.start, self.stop_at = int(start), stop
        self.end = 0
        self.records = 0
        self.last_seq = 0
        self.duplicates = 0
        self.damage: JournalDamage | None = None
        self.file_bytes = 0
        self._cur: tuple[int, int] | None = None   # (offset, seq) of the record last yielded
        self._prev_state = (0, 0, 0)

    def _damaged(self, kind: str, offset: int, detail: str) -> None:
        self.damage = JournalDamage(kind, offset, detail, self.records, self.last_seq, self.file_bytes)

    def stop(self, detail: str) -> None:
        """Declare the record last yielded unusable: the intact prefix ends before it."""
        if self._cur is None:
            raise JournalError("Scan.stop() called before any record was yielded")
        offset, seq = self._cur
        self.end, self.records, self.last_seq = self._prev_state
        self._damaged("bad_record", offset, f"record seq {seq}: {detail}")

    def __iter__(self) -> Iterator[tuple[int, bytes, int]]:
        if not self.path.exists():
            return
        with open(self.path, "rb", buffering=1 << 20) as f:
            self.file_bytes = os.fstat(f.fileno()).st_size
            if self.start:  # a later part of a journal whose head was read before
                f.seek(self.start)
                self.end = self.start
                yield from self._body(f, self.start, any_first_seq=True)
            else:
                yield from self._frames(f)

    def _frames(self, f: BinaryIO) -> Iterator[tuple[int, bytes, int]]:
        size = self.file_bytes
        if size == 0:
            return
        magic = f.read(len(FILE_MAGIC))
        if magic != FILE_MAGIC:
            if len(magic) < len(FILE_MAGIC) and FILE_MAGIC.startswith(magic):
                self._damaged("torn_tail", 0, "the file header itself is incomplete")
            else:
                self._damaged("not_a_journal", 0, f"file does not start with {FILE_MAGIC!r}")
            return
        self.end = len(FILE_MAGIC)
        yield from self._body(f, self.end, any_first_seq=False)

    def _body(self, f: BinaryIO, pos: int, *, any_first_seq: bool) -> Iterator[tuple[int, bytes, int]]:
        size = self.file_bytes if self.stop_at is None else min(self.file_bytes, self.stop_at)
        recent: dict[int, int] = {}
        while pos < size:
            head = f.read(HEADER)
            if len(head) < HEADER:
                self._damaged("torn_tail", pos, f"{len(head)} of {HEADER} header bytes at the end of the file")
                return
            magic, length, seq, pcrc = _HEAD.unpack_from(head)
            (hcrc,) = _HCRC.unpack_from(head, _HEAD.size)
            if magic != _FRAME_MAGIC or crc32c(head[:_HEAD.size]) != hcrc:
                if _zeros_from(f, pos, size):
                    self._damaged("torn_tail", pos, "the last frame's header turns into zeros that run to the end of "
                                                    "the file")
                else:
                    self._damaged("bad_header", pos, "frame header magic or checksum does not match")
                return
            if pos + HEADER + length > size:
                self._damaged("torn_tail", pos, f"record seq {seq} needs {length} payload bytes, "
                                                f"{size - pos - HEADER} remain")
                return
            payload = f.read(length)
            if crc32c(payload) != pcrc:
                if _zeros_from(f, pos, size):
                    self._damaged("torn_tail", pos, f"record seq {seq}: its payload turns into zeros that run to the "
                                                    "end of the file")
                else:
                    self._damaged("bad_checksum", pos, f"record seq {seq}: payload checksum does not match")
                return
            nxt = pos + HEADER + length
            if any_first_seq and self.records == 0 and not recent:
                self.last_seq = seq - 1
            if seq != self.last_seq + 1:
                if recent.get(seq) == pcrc:
                    self.duplicates += 1
                    pos = self.end = nxt
                    continue
                self._damaged("sequence_gap", pos, f"record seq {seq} follows seq {self.last_seq}")
                return
            recent[seq] = pcrc
            if len(recent) > _DUP_WINDOW:
                del recent[next(iter(recent))]
            self._prev_state = (self.end, self.records, self.last_seq)
            self._cur = (pos, seq)
            self.records += 1
            self.last_seq = seq
            pos = self.end = nxt
            yield seq, payload, self._cur[0]
            if self.damage is not None:  # the caller called stop()
                return


def _zeros_from(f: BinaryIO, frame: int, size: int) -> bool:
    """Whether the file ends in zeros that a crash leaves, from inside the damaged frame at ``frame``: when the
    file's size reached the disk and its last blocks did not, the run of zeros starts where a block starts
    (a multiple of ``BLOCK`` bytes into the file) or covers the whole frame. A record whose own bytes end in
    zeros and were changed elsewhere does not pass: its zeros start where its bytes happen to end. Reads
    backwards from ``size`` only as far as the run goes."""
    end = size
    while end > frame:
        start = max(end - (1 << 20), frame)
        f.seek(start)
        chunk = f.read(end - start)
        last = len(chunk.rstrip(b"\0"))
        if last:
            run = start + last  # the first zero byte of the run
            return run < size and run % BLOCK == 0
        end = start
    return size > frame  # the whole frame, header and all, reads as zeros


def frames_after(path: str | os.PathLike[str], offset: int) -> Iterator[bytes]:
    """The payloads of the well-formed frames after ``offset`` (found by their magic and checksums):
    what a damaged journal holds beyond the part that can be recovered."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size <= offset + 1:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            i = data.find(_FRAME_MAGIC, offset + 1)
            while i >= 0:
                head = data[i:i + HEADER]
                if len(head) == HEADER and crc32c(head[:_HEAD.size]) == _HCRC.unpack_from(head, _HEAD.size)[0]:
                    _, length, _, pcrc = _HEAD.unpack_from(head)
                    body = data[i + HEADER:i + HEADER + length]
                    if len(body) == length and crc32c(body) == pcrc:
                        yield body
                        i = data.find(_FRAME_MAGIC, i + HEADER + length)
                        continue
                i = data.find(_FRAME_MAGIC, i + 1)


def count_frames_after(path: str | os.PathLike[str], offset: int) -> int:
    """How many well-formed frames lie after ``offset`` (see :func:`frames_after`)."""
    return sum(1 for _ in frames_after(path, offset))
