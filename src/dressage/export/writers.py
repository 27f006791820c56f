"""Writers of exported sessions: Parquet and JSONL (one row per Segment), slime's debug-rollout dump,
and the session viewer page. Each writes a temporary file beside ``path`` and renames it into place,
so a reader never sees half a file.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from dressage.errors import ConfigError
from dressage.proxy.trajectory_files import atomic_write, write_rows_jsonl, write_rows_parquet
from dressage.trajectory.rows import ExportedSession, segment_rows

__all__ = ["FORMATS", "write_jsonl", "write_parquet", "write_slime", "write_html", "slime_dicts"]

FORMATS = ("parquet", "jsonl", "slime")


def write_jsonl(sessions: Sequence[ExportedSession], path: str | os.PathLike[str]) -> Path:
    """One JSON object per Segment (R3 ids as base64 of their compact bytes)."""
    return write_rows_jsonl(segment_rows(sessions), path)


def write_parquet(sessions: Sequence[ExportedSession], path: str | os.PathLike[str]) -> Path:
    """One row per Segment (:data:`dressage.trajectory.rows.ROW_FIELDS`), readable by pyarrow and datasets."""
    return write_rows_parquet(segment_rows(sessions), path)


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
    return atomic_write(target, lambda tmp: torch.save({"rollout_id": rollout_id, "samples": samples}, tmp))


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
    return atomic_write(path, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
