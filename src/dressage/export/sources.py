"""Where exported sessions come from: a running Proxy (its admin read) or a journal file (replayed).

A Proxy is read under a lease: released afterwards, so the trajectories stay for the trainer, or
acknowledged with ``drain``. Large fields in TransferQueue are restored through the TQ the Proxy (or
``tq_spec``) names, without releasing its keys; a journal without ``tq_spec`` keeps them as refs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

from dressage.errors import JournalError
from dressage.trajectory.rows import ExportedSession
from dressage.trajectory import Sample, build_segments
from dressage.trajectory.view import session_document

__all__ = ["from_proxy", "from_journal"]


def _restore(samples: list[Sample], client: Any) -> None:
    from dressage.train.reader import TrainingReader

    if any(s.remote for s in samples):
        TrainingReader(client).restore(samples)


def from_proxy(url: str, *, token: str | None = None, drain: bool = False,
               timeout_s: float = 60.0) -> list[ExportedSession]:
    """The Proxy's finalized trajectories with their session documents, restored from its TQ."""
    from dressage.train.remote import ProxyTrajectorySource

    source = ProxyTrajectorySource(url, token=token, timeout_s=timeout_s)
    try:
        batch = source.read(lease=True)
        try:
            if any(s.remote for s in batch.samples):
                _restore(batch.samples, source.client())
            by_session: dict[str, list[Sample]] = {}
            for s in batch.samples:
                by_session.setdefault(s.session_id, []).append(s)
            out = []
            for sid, samples in by_session.items():
                doc = source.session_document(sid)
                out.append(ExportedSession(sid, samples, doc, reward=doc.get("reward"),
                                           metadata=dict(doc.get("metadata") or {})))
        except BaseException:
            source.release(batch)
            raise
        if drain:
            source.ack(batch)
        else:
            source.release(batch)
        return out
    finally:
        source.close()


def from_journal(path: str | os.PathLike[str], *, tq_spec: Mapping[str, Any] | None = None,
                 segment_view: str = "lineage", token_text: Callable[[int], str | None] | None = None
                 ) -> list[ExportedSession]:
    """The finalized sessions a journal replays to (read only), their Segments built in ``segment_view``.
    Large fields the journal holds only as refs are restored from the TQ of ``tq_spec`` when given;
    ``token_text(id)`` gives the session documents each token's text."""
    from dressage.proxy.journal.log import Journal

    p = Path(path)
    if not p.is_file():
        raise JournalError(f"no journal file at {p}")
    sessions, _ = Journal.replay(p)
    out = []
    for sid, session in sessions.items():
        if session.state != "finalized":
            continue
        segs = build_segments(session, segment_view)  # type: ignore[arg-type]
        samples = [Sample.from_segment(seg, reward=session.reward) for seg in segs]
        out.append(ExportedSession(sid, samples, session_document(session, segs, token_text=token_text), reward=session.reward,
                                   metadata=dict(session.metadata)))
    if tq_spec is not None and any(s.remote for ex in out for s in ex.samples):
        from dressage.tq import TransferQueueClient

        client = TransferQueueClient.connect(dict(tq_spec))
        try:
            _restore([s for ex in out for s in ex.samples], client)
        finally:
            client.close()
    return out
