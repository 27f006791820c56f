"""Trajectory files: Segment rows as JSONL or Parquet, written atomically, and the Proxy's per-trajectory
directory writer (``--export-dir``).

Each file is written to a temporary name beside its path and renamed into place, so a reader of the
directory never sees half a trajectory. ``dressage export`` writes through the same functions.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from dressage.errors import ConfigError, DressageError
from dressage.trajectory import Sample
from dressage.trajectory.rows import ExportedSession, segment_rows
from dressage.trajectory.view import session_document

__all__ = ["atomic_write", "parquet_schema", "write_rows_jsonl", "write_rows_parquet", "TrajectoryDirWriter",
           "DIR_FORMATS"]

log = logging.getLogger(__name__)

DIR_FORMATS = ("jsonl", "parquet")


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], None]) -> Path:
    """``write(tmp)`` a temporary file beside ``path``, then rename it over ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target


def parquet_schema() -> Any:
    """The Arrow schema of a Segment row (:data:`dressage.trajectory.rows.ROW_FIELDS`)."""
    import pyarrow as pa

    return pa.schema([
        ("session_id", pa.string()), ("segment_index", pa.int32()), ("group_index", pa.int64()),
        ("index", pa.int64()), ("branch_from", pa.int64()), ("boundary_reason", pa.string()),
        ("step_ids", pa.list_(pa.int64())), ("reward", pa.float64()), ("tokens", pa.list_(pa.int32())),
        ("prompt_length", pa.int32()), ("response_length", pa.int32()), ("loss_mask", pa.list_(pa.int32())),
        ("token_versions", pa.list_(pa.int64())), ("rollout_log_probs", pa.list_(pa.float32())),
        ("r3_ids", pa.binary()), ("r3_dtype", pa.string()), ("r3_shape", pa.list_(pa.int32())),
        ("messages", pa.string()), ("tools", pa.string()), ("metadata", pa.string()),
        ("large_field_refs", pa.string()),
    ])


def write_rows_jsonl(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """One JSON object per row (R3 ids as base64 of their compact bytes)."""
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for row in rows:
                if row["r3_ids"] is not None:
                    row = {**row, "r3_ids": base64.b64encode(row["r3_ids"]).decode("ascii")}
                f.write(json.dumps(row, separators=(",", ":"), allow_nan=False) + "\n")
    return atomic_write(path, write)


def write_rows_parquet(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """The rows as one Parquet table (readable by pyarrow and datasets)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(list(rows), schema=parquet_schema())
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class TrajectoryDirWriter:
    """Writes each finalized trajectory to ``directory/<session id>.<format>``, atomically.

    Large fields the Proxy keeps resident are written as values; those in TransferQueue as their refs'
    sizes (``large_field_refs``). A write that fails is logged and counted (``failed``): finalize has
    already happened and the trajectory stays readable from the Proxy.
    """

    def __init__(self, directory: str | os.PathLike[str], fmt: str = "jsonl") -> None:
        if fmt not in DIR_FORMATS:
            raise ConfigError(f"export.format: expected one of {', '.join(DIR_FORMATS)}, got {fmt!r}")
        if fmt == "parquet":
            import pyarrow  # noqa: F401  (fail at start, not at the first finalize)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.format = fmt
        self.written = 0
        self.failed = 0

    def path_of(self, session_id: str) -> Path:
        # A session id is the agent's string: never a path of its own.
        safe = _UNSAFE.sub("_", session_id)[:200] or "_"
        return self.directory / f"{safe}.{self.format}"

    def write(self, done: Any, session: Any) -> Path:
        """Write one FinalizedSession (``session`` is its Session, for the step tree)."""
        samples = [Sample.from_segment(seg, reward=done.reward, metadata={k: v for k, v in done.metadata.items()
                                                                          if k in ("instance_id", "label")})
                   for seg in done.segments]
        doc = session_document(session, done.segments, reward=done.reward)
        rows = segment_rows([ExportedSession(done.session_id, samples, doc, reward=done.reward)])
        writer = write_rows_parquet if self.format == "parquet" else write_rows_jsonl
        return writer(rows, self.path_of(done.session_id))

    def tee(self, sink: Callable[[Any], None] | None,
            session_of: Callable[[str], Any]) -> Callable[[Any], None]:
        """A sink that writes each FinalizedSession, then hands it to ``sink``."""
        def deliver(done: Any) -> None:
            try:
                self.write(done, session_of(done.session_id))
                self.written += 1
            except (OSError, ValueError, TypeError, DressageError) as exc:
                self.failed += 1
                log.warning("trajectory %s was not written to %s: %s", done.session_id, self.directory, exc)
            if sink is not None:
                sink(done)
        if sink is not None and hasattr(sink, "discard"):
            deliver.discard = sink.discard  # type: ignore[attr-defined]
        return deliver
