"""Writers of exported sessions: Parquet and JSONL (one row per Segment), slime's debug-rollout dump,
and the session viewer page. Each writes a temporary file beside ``path`` and renames it into place,
so a reader never sees half a file.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from dressage.errors import ConfigError
from dressage.export.rows import ExportedSession, segment_rows

__all__ = ["FORMATS", "write_jsonl", "write_parquet", "write_slime", "write_html", "parquet_schema"]

FORMATS = ("parquet", "jsonl", "slime")


def _atomic(path: str | os.PathLike[str], write: Callable[[str], None]) -> Path:
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


def write_jsonl(sessions: Sequence[ExportedSession], path: str | os.PathLike[str]) -> Path:
    """One JSON object per Segment (R3 ids as base64 of their compact bytes)."""
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for row in segment_rows(sessions):
                if row["r3_ids"] is not None:
                    row["r3_ids"] = base64.b64encode(row["r3_ids"]).decode("ascii")
                f.write(json.dumps(row, separators=(",", ":"), allow_nan=False) + "\n")
    return _atomic(path, write)


def parquet_schema() -> Any:
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


def write_parquet(sessions: Sequence[ExportedSession], path: str | os.PathLike[str]) -> Path:
    """One row per Segment (:data:`dressage.export.rows.ROW_FIELDS`), readable by pyarrow and datasets."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(segment_rows(sessions), schema=parquet_schema())
    return _atomic(path, lambda tmp: pq.write_table(table, tmp))


def slime_dicts(sessions: Sequence[ExportedSession]) -> list[dict[str, Any]]:
    """The Samples as slime's ``Sample.to_dict()`` dicts (status as its value), rollout ids by session."""
    from dressage.integrations.slime import SlimeSample, to_slime_sample
    import dataclasses

    out = []
    for rollout_id, ex in enumerate(sessions):
        for sample in ex.samples:
            if not sample.is_restored:
                raise ConfigError(f"slime dump: session {sample.session_id} segment {sample.segment_index} has "
                                  "large fields only as TransferQueue refs; give --tq-spec to restore them")
            s = to_slime_sample(sample, rollout_id=rollout_id, cls=SlimeSample)
            d = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
            d["status"] = s.status.value
            d["spec_info"] = {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                              "completion_token_num": 0}
            d["prefix_cache_info"] = {"cached_tokens": 0, "total_prompt_tokens": 0}
            out.append(d)
    return out


def write_slime(sessions: Sequence[ExportedSession], path: str | os.PathLike[str], *, rollout_id: int = 0) -> Path:
    """slime's ``--save-debug-rollout-data`` file: ``torch.save({"rollout_id", "samples": [Sample.to_dict()]})``,
    which ``--load-debug-rollout-data`` trains from with no engine. A ``{rollout_id}`` in ``path`` is filled."""
    import torch

    samples = slime_dicts(sessions)
    for d in samples:  # slime keeps R3 as a tensor after its own loader; the dump carries int32 arrays
        if d["rollout_routed_experts"] is not None:
            d["rollout_routed_experts"] = torch.from_numpy(np.array(d["rollout_routed_experts"], dtype=np.int32))
    target = str(path).format(rollout_id=rollout_id) if "{rollout_id}" in str(path) else path
    return _atomic(target, lambda tmp: torch.save({"rollout_id": rollout_id, "samples": samples}, tmp))


def write_html(sessions: Sequence[ExportedSession] | Sequence[Mapping[str, Any]], path: str | os.PathLike[str], *,
               title: str = "Dressage sessions", figures: Sequence[str | os.PathLike[str]] = (),
               capacity: Mapping[str, Any] | None = None,
               timeline: Sequence[Mapping[str, Any]] = ()) -> Path:
    """The session viewer as one file with its data inside; ``figures`` are PNG files embedded as pictures,
    ``timeline`` the run's memory samples (``{"label", "bytes"}``)."""
    from dressage.proxy.http.viewer_page import render_viewer

    docs = [s.document if isinstance(s, ExportedSession) else dict(s) for s in sessions]
    pics = [{"name": Path(f).name, "png_base64": base64.b64encode(Path(f).read_bytes()).decode("ascii")}
            for f in figures if Path(f).is_file()]
    page = render_viewer(docs, title=title, figures=pics, capacity=capacity, timeline=timeline)
    return _atomic(path, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
