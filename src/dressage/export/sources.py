"""Where exported sessions come from: a running Proxy (its admin read) or a journal file (replayed).

A Proxy is read under a lease held while the export writes (:func:`reading_proxy`): released afterwards,
so the trajectories stay for the trainer, or, with ``drain``, acknowledged only once the writing went
through, and the TransferQueue keys of the sessions the ack covered released (the export is then what
consumed them; a session a named read took over meanwhile stays that reader's). Large fields in
TransferQueue are restored through the TQ the Proxy (or ``tq_spec``) names; a journal without ``tq_spec``
keeps them as refs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Mapping

from dressage.errors import JournalError
from dressage.trajectory.rows import ExportedSession
from dressage.trajectory import Sample, build_segments
from dressage.trajectory.view import session_document

__all__ = ["from_proxy", "reading_proxy", "from_journal"]

log = logging.getLogger(__name__)


def _restore(samples: list[Sample], client: Any) -> None:
    from dressage.train.reader import TrainingReader

    if any(s.remote for s in samples):
        TrainingReader(client).restore(samples)


@contextmanager
def reading_proxy(url: str, *, token: str | None = None, drain: bool = False,
                  timeout_s: float = 60.0) -> Iterator[list[ExportedSession]]:
    """The Proxy's finalized trajectories with their session documents, restored from its TQ, held under a
    lease while the ``with`` block runs. A block that ends with an error (a file that could not be written)
    releases the read: nothing is forgotten. One that ends well acknowledges it with ``drain`` (the Proxy
    forgets the trajectories, and the TQ keys of those the ack covered are released: nobody else will read
    them; a session a named read, e.g. the trainer's, took over while the export wrote is that reader's,
    keys and all), else releases it (they stay for the trainer)."""
    from dressage.train.reader import release_batch
    from dressage.train.remote import ProxyTrajectorySource

    source = ProxyTrajectorySource(url, token=token, timeout_s=timeout_s)
    try:
        batch = source.read(lease=True)  # its keys by session are taken now: the restore drops the refs
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
            yield out
            if drain:
                source.ack(batch)
        except BaseException:
            source.release(batch, quiet=True)
            raise
        if not drain:
            source.release(batch)
            return
        keys = batch.acknowledged_keys()
        if keys:
            release_batch(source.client(), keys)
        taken = batch.unacknowledged()
        if taken:
            log.warning("%d exported sessions were taken over by another read before the export acknowledged "
                        "them: they were written but not drained, and stay with that reader (e.g. %s)",
                        len(taken), taken[0])
    finally:
        source.close()


def from_proxy(url: str, *, token: str | None = None, drain: bool = False,
               timeout_s: float = 60.0) -> list[ExportedSession]:
    """The Proxy's finalized trajectories with their session documents, restored from its TQ; ``drain``
    has the Proxy forget them (and their TQ keys go) once they were read (:func:`reading_proxy` holds the
    read while a caller writes them)."""
    with reading_proxy(url, token=token, drain=drain, timeout_s=timeout_s) as sessions:
        return sessions


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
