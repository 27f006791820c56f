"""Finalized trajectories and the use cases over them: finalize, abort, discard, read, ack, forget.

:class:`Trajectories` owns what a Proxy keeps between a session's finalize and the trainer's ack
(finalized sessions in finalize order, the finalize ledger, finalizes under way, read leases). The
routes upstream Dressage's clients call only parse bodies and call it; read selection and its envelope
are :mod:`dressage.proxy.upstream.read`, leases :mod:`dressage.proxy.upstream.leases`. A trajectory
is forgotten only once its reader acknowledged it, or once a draining read's answer was written whole.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from dressage.errors import ConfigError, NoTransferQueueError, SessionStateError, UnknownSessionError
from dressage.proxy.config import ProxyConfig
from dressage.proxy.recording.core import FinalizedSession, ProxyCore
from dressage.proxy.recording.heap import trim_heap
from dressage.proxy.recording.lifecycle import InFlight
from dressage.proxy.upstream.leases import ReadLeases
from dressage.proxy.upstream.ledger import FinalizeLedger, count_turns
from dressage.proxy.recording.session_book import SessionBook
from dressage.proxy.recording.turns import instance_group
from dressage.proxy.upstream.read import (GroupRule, SegmentFormat, finalization_id, read_answer,
                                          select_trajectories)
from dressage.trajectory import build_segments
from dressage.trajectory.sample_wire import samples_wire

__all__ = ["Trajectories"]


class Trajectories:
    """The finalized trajectories of one Proxy and every use case that finalizes, reads or drops them.

    ``in_flight``: finalize waits (bounded) for the session's running calls; ``book``: per-session
    state to drop; ``stats()``: the counters a read's ``meta_info`` carries; ``tq_spec()``: the
    TransferQueue client spec a trainer in another process joins (``None`` without one).
    """

    def __init__(self, config: ProxyConfig, core: ProxyCore, *, in_flight: InFlight, book: SessionBook,
                 stats: Callable[[], dict[str, Any]], tq_spec: Callable[[], dict[str, Any]] | None = None) -> None:
        self.config, self.core, self.in_flight, self.book = config, core, in_flight, book
        self._stats, self._tq_spec = stats, tq_spec
        self.finalized: dict[str, FinalizedSession] = {}
        """Finalized sessions not read and drained yet, in finalize order."""
        self.ledger = FinalizeLedger()
        """Answers of finalizes, so that a repeat answers the same."""
        self.finalizing: dict[str, asyncio.Future] = {}
        """Finalizes under way (a concurrent repeat waits for the same answer)."""
        self.heap_trims, self.heap_trim_s = 0, 0.0
        """Trims after forgetting a batch of sessions, and the time they took."""
        self.leases = ReadLeases()
        """Trajectories handed out by a two-phase read and not acknowledged yet."""
        self.observe_group_wait: Callable[[float], None] | None = None
        """Told, once per prompt group a batch read hands over, the seconds from the group's first
        finalize to that read (the Proxy's metrics set it)."""
        self._handed: set[str] = set()
        """Finalized sessions a batch read handed over in a group already told (kept while finalized)."""
        self.on_end: Callable[[str, str], None] | None = None
        """Told ``(session id, state)`` when a session ends here (finalized, aborted, discarded): the Proxy's
        pause fails that session's held calls at once."""

    def _ended(self, session_id: str, state: str) -> None:
        if self.on_end is not None:
            self.on_end(session_id, state)

    def _spec(self) -> dict[str, Any] | None:
        return self._tq_spec() if self._tq_spec is not None else None

    def transfer_queue_spec(self) -> dict[str, Any]:
        """The client spec of this Proxy's TransferQueue, the one a read's ``meta_info.transfer_queue``
        carries (``GET /transfer_queue/spec``: training ranks join it without reading); raises
        :class:`NoTransferQueueError` when the Proxy runs without one."""
        spec = self._spec()
        if spec is None:
            raise NoTransferQueueError("this Proxy runs without TransferQueue (start it with --enable-transfer-queue): "
                                       "its reads carry the large fields themselves, there is no spec to join")
        return spec

    def adopt(self, delivered: Iterable[FinalizedSession],
              acknowledged: Mapping[str, Sequence[str]] | None = None) -> None:
        """Take back trajectories a journal replay found finalized and not yet read, and the reads it found
        acknowledged (read id -> the sessions their ack forgot): a repeat of such an ack, whose answer a
        restart may have cut off, answers what it forgot."""
        for done in delivered:
            self.finalized[done.session_id] = done
        for read_id, sids in (acknowledged or {}).items():
            self.leases.acknowledged_before(read_id, sids)

    # ------------------------------------------------------------ finalize, abort
    def finalize(self, session_id: str, reward: float | None,
                 metadata: dict[str, Any] | None = None, *, allow_empty: bool = False) -> FinalizedSession:
        """Cut the session's Segments now (no wait, no ledger: :meth:`finalize_session` is the client's);
        ``metadata`` is merged into the session's with the finalize (journaled with it); ``allow_empty``:
        a session without steps is finalized too (no Segments)."""
        done = self.core.finalize(session_id, reward, metadata=metadata, allow_empty=allow_empty)
        self.book.keeper.release(session_id)
        self.finalized[session_id] = done
        self._ended(session_id, "finalized")
        return done

    def abort(self, session_id: str) -> dict[str, Any]:
        """Abort a session: its TQ keys are deleted, nothing more may be recorded, it leaves memory."""
        released = self.core.abort(session_id)
        self.finalized.pop(session_id, None)
        self.leases.drop(session_id)
        self.ledger.drop(session_id)  # a finalize answer kept under the id is an earlier life's
        self.book.forget_state(session_id)
        self._ended(session_id, "aborted")
        return {"session_id": session_id, "state": "aborted", "released_refs": released}

    def segments(self, session_id: str) -> list[dict[str, Any]]:
        """Summaries of a finalized session's Segments."""
        done = self.finalized.get(session_id)
        if done is None:
            s = self.core.session(session_id)  # 404 when unknown
            raise SessionStateError(f"session {session_id} is {s.state}; segments exist after finalize")
        return [seg.to_summary() for seg in done.segments]

    def forget(self, session_ids: Iterable[str], *, read_id: str | None = None) -> None:
        """Drop finished sessions once their Samples were consumed: all of them, in one journal record
        (``read_id``: the read whose ack this is), or, when that write fails, none.

        The heap pages they freed are then handed back to the OS (:func:`trim_heap`), so that what
        a batch left behind does not stay mapped as free heap into the next.
        """
        sids = list(session_ids)
        self.core.forget(*sids, read_id=read_id)  # journaled first: a failed write raises with every one here
        for sid in sids:
            self.finalized.pop(sid, None)
            self.leases.drop(sid)
            self.book.forget_state(sid)
        if sids:
            self.heap_trim_s += trim_heap()
            self.heap_trims += 1

    # ------------------------------------------------------------ upstream's clients
    def _answer(self, sid: str, done: Any, session: Any, waited: bool) -> dict[str, Any]:
        meta = done.metadata
        return {"success": True, "session_id": sid, "trajectory_id": sid, "instance_id": meta.get("instance_id"),
                "label": meta.get("label"), "reward": done.reward, "num_steps": len(session.steps),
                "num_turns": count_turns(session.steps.values()), "num_segments": len(done.segments),
                "segments": len(done.segments), "in_flight_done": waited,
                "segment_view": self.core.config.segment_view, "finalization_id": finalization_id(done)}

    async def finalize_session(self, sid: str, *, reward: float | None = None, instance_id: str | None = None,
                               label: Any = None, wait_s: float | None = None) -> dict[str, Any]:
        """Finalize once: wait (bounded) for the session's calls in flight, record ``instance_id`` /
        ``label``, build Segments. A repeat, or a finalize that arrives while one runs, answers what
        the first finalize answered."""
        prior = self._kept_answer(sid)
        if prior is not None:
            return prior
        running = self.finalizing.get(sid)
        if running is not None:
            return await asyncio.shield(running)
        self.core.session(sid)  # 404 for an unknown session, 409 for an aborted one
        fut = self.finalizing[sid] = asyncio.get_running_loop().create_future()
        try:
            answer = await self._finalize_once(sid, reward, instance_id, label, wait_s)
        except BaseException as exc:
            if isinstance(exc, Exception):
                fut.set_exception(exc)
                fut.exception()  # those who wait re-raise it; nobody else has to look
            else:
                fut.cancel()
            raise
        finally:
            self.finalizing.pop(sid, None)
        fut.set_result(answer)
        return answer

    def _kept_answer(self, sid: str) -> dict[str, Any] | None:
        """The kept answer of the finalize of the session ``sid`` names now, if any. An answer is of one life
        of the id: once a drained id is used again, the answer of its earlier life is no answer for the
        new session (which is then finalized in its own right)."""
        prior = self.ledger.get(sid)
        current = self.core.sessions.get(sid)
        if prior is not None and current is not None and current.finalization_id != prior["finalization_id"]:
            self.ledger.drop(sid)
            return None
        return prior

    async def _finalize_once(self, sid: str, reward: float | None, instance_id: str | None, label: Any,
                             wait_s: float | None) -> dict[str, Any]:
        limit = self.config.sessions.finalize_wait_s if wait_s is None else wait_s  # --finalize-wait
        waited = await self.in_flight.wait_idle(sid, limit)
        session = self.core.session(sid)
        done = self.finalized.get(sid)
        if session.state == "finalized" and done is not None:
            answer = self._answer(sid, done, session, waited)  # finalized before a restart (journal)
            self.ledger.put(sid, answer)
            return answer
        update: dict[str, Any] = {}
        if session.state == "active":
            if instance_id is not None:
                update["instance_id"] = str(instance_id)
                update["group_index"] = instance_group(instance_id)
            if label is not None:
                update["label"] = label
        # The wait ran out with a call still in flight: the session ends now whatever it recorded, the
        # late call is refused at its commit (409), also when it was the session's first (no steps then,
        # and no Segments: the trajectory is empty). A session with no step and nothing in flight is a 409.
        done = await asyncio.to_thread(self.finalize, sid, reward, update or None, allow_empty=not waited)
        answer = self._answer(sid, done, self.core.session(sid), waited)
        self.ledger.put(sid, answer)
        return answer

    def discard(self, sid: str) -> dict[str, Any]:
        """Drop a session (active or finalized) and its TransferQueue keys; a repeat is a no-op."""
        out = self.core.discard(sid)
        done = self.finalized.pop(sid, None)
        self.leases.drop(sid)
        self.ledger.drop(sid)
        self.book.forget_state(sid)
        self._ended(sid, "discarded")
        # Upstream's keys: whether this call removed a session, and how many unread Segments went with it.
        return {"success": True, **out, "session_removed": out.get("was") in ("active", "finalized"),
                "segments_removed": len(done.segments) if done is not None else 0}

    def read(self, *, trajectory_id: str | None = None, session_id: str | None = None,
             session_ids: Sequence[str] | None = None, instance_id: str | None = None,
             max_groups: int | None = None, segment_view: str | None = None,
             drain: bool = False, format: str = "segments", binary: bool = False,
             min_group_size: int | None = None, group_timeout_s: float | None = None,
             lease: bool = False, lease_s: float | None = None) -> dict[str, Any]:
        """``POST /trajectory/read`` in upstream's envelope (see :mod:`dressage.proxy.upstream.read`).

        Nothing is forgotten here. ``lease`` (and ``drain``) hands the trajectories out under a
        ``read_id`` (in the answer) for ``lease_s`` (default: the Proxy's ``reads.lease_s``): batch
        reads skip them until :meth:`ack` forgets them, :meth:`release` hands them back, or the lease
        expires. A draining read is acknowledged by its route once the answer was written in full;
        one whose answer could not be written is released (:meth:`release`).

        A named trajectory that is not finalized is an error: ``UnknownSessionError`` when unknown (or
        drained; the route answers upstream's 200 ``success: false``), 409 when still active or aborted. ``format="samples"`` answers, per trajectory, its Samples in wire form
        (large fields as FieldRefs when TQ is on) with the TQ client spec in ``meta_info``: what a
        trainer in another process needs (:mod:`dressage.train.remote`); ``binary`` gives resident arrays
        as bytes, for a msgpack answer. ``min_group_size`` / ``group_timeout_s`` override the Proxy's
        ``reads`` settings for this batch read (:class:`~dressage.proxy.upstream.read.GroupRule`).
        """
        reads = self.config.reads
        rule = GroupRule(reads.min_group_size if min_group_size is None else min_group_size,
                         reads.group_timeout_s if group_timeout_s is None else group_timeout_s)
        hold = ReadLeases.check_lease_s(reads.lease_s if lease_s is None else lease_s)
        self.leases.expire()
        # An empty ``session_ids`` names no trajectory (reads nothing), never "every trajectory".
        named = trajectory_id is not None or session_id is not None or session_ids is not None
        # A batch read skips what another read holds; a named read takes exactly what it names.
        pool = self.finalized if named or not self.leases.open else \
            {sid: done for sid, done in self.finalized.items() if self.leases.held(sid) is None}
        now = time.monotonic()
        selection = select_trajectories(pool, trajectory_id=trajectory_id, session_id=session_id,
                                        session_ids=session_ids, instance_id=instance_id, max_groups=max_groups,
                                        groups_rule=rule, now=now)
        if selection.mode == "batch" and selection.groups:
            self._tell_group_waits(selection.groups, now)
        for sid in selection.missing:
            state = self.core.state_of(sid)
            if state is None:
                raise UnknownSessionError(f"unknown trajectory {sid!r} (never finalized here, or already drained)")
            raise SessionStateError(f"session {sid} is {state}; its trajectory exists after finalize")
        cfg = self.core.config
        segments_of = None
        if segment_view is not None and segment_view != cfg.segment_view:
            if format == "samples":
                raise ConfigError(f"segment_view: Samples are built with the Proxy's --segment-view "
                                  f"({cfg.segment_view}) at finalize; read them without segment_view, or with "
                                  f"{cfg.segment_view!r}", param="segment_view")
            if cfg.drop_retry_orphans:
                raise ConfigError(f"segment_view differs from the Proxy's --segment-view ({cfg.segment_view}), and "
                                  "retry orphans were dropped (their keys released) at finalize: read with the "
                                  "Proxy's view", param="segment_view")

            def segments_of(done: Any) -> list[Any]:
                return build_segments(self.core.session(done.session_id), segment_view)
        if format == "samples":
            data = [{"session_id": sid, "reward": self.finalized[sid].reward,
                     "metadata": self.finalized[sid].metadata,
                     "samples": samples_wire(self.finalized[sid], binary=binary)}
                    for sid in selection.session_ids]
            spec = self._spec()
            answer = {"success": bool(data), "mode": "samples", "data": data, "drained": bool(drain),
                      "meta_info": {"trajectories": len(data), "groups": len(selection.groups),
                                    "transfer_queue": spec, "selection": selection.mode,
                                    "incomplete_groups": selection.incomplete,
                                    "timed_out_groups": selection.timed_out}}
        else:
            answer = read_answer(selection, self.finalized, drained=drain, stats=self._stats(),
                                 segments_of=segments_of,
                                 form=SegmentFormat(reads.record_token_versions, reads.mask_nonlast_version_tokens))
        if (lease or drain) and selection.session_ids:
            granted = self.leases.grant(selection.session_ids, hold)
            answer["read_id"], answer["lease_s"] = granted.read_id, hold
        return answer

    def _tell_group_waits(self, groups: Sequence[Sequence[str]], now: float) -> None:
        """Each group handed over for the first time: how long it waited since its first session finalized.
        A group handed out again (its lease released or expired, a read that neither leases nor drains)
        was told the first time."""
        self._handed.intersection_update(self.finalized)  # what was forgotten meanwhile
        for members in groups:
            if self.observe_group_wait is not None and self._handed.isdisjoint(members):
                first = min(self.finalized[sid].finalized_at for sid in members)
                self.observe_group_wait(max(now - first, 0.0))
            self._handed.update(members)

    def ack(self, read_id: str) -> dict[str, Any]:
        """The reader holds what read ``read_id`` handed out: forget those trajectories.

        The answer names the sessions the ack covers (``acknowledged_session_ids``: their TQ keys are the
        reader's to release once it is done with them) and those a named read took over from this one
        (``taken_over``: their reader is that read's, and so are their keys). A read that lost every
        session that way acknowledges none. A repeat answers ``already`` and the same sessions, also after
        a restart (the ack is journaled with its read id); an ack after the lease expired (or was
        released) is a 409 (its trajectories were readable again). The ack is one journal record: a write
        that fails (507 / 503), or a crash before the record is whole on disk, forgets none of them; they
        stay under the lease (readable again after a restart) and the ack may be repeated.
        """
        ended = self.leases.ended(read_id)
        if ended is not None and ended.how in ("acknowledged", "taken over"):
            return self._lease_answer(ended, already=ended.how == "acknowledged", acknowledged=0)
        self.leases.expire()
        lease = self.leases.lease(read_id)
        sids = list(lease.session_ids)
        self.forget(sids, read_id=read_id)
        lease.acknowledged += sids
        self.leases.finish(read_id, "acknowledged")
        return self._lease_answer(lease, already=False, acknowledged=len(sids))

    def release(self, read_id: str) -> dict[str, Any]:
        """Hand read ``read_id``'s trajectories back (the reader could not use them): readable again now.

        A read that ended already (released, expired, acknowledged, taken over) hands nothing back
        (``released`` 0; ``already`` when it was released). Sessions an ack of this read forgot (one whose
        answer the reader never got, also before a restart) cannot be handed back: the answer names them
        (``acknowledged_session_ids``; their TQ keys are the reader's). 404 when never granted."""
        self.leases.expire()
        ended = self.leases.ended(read_id)
        if ended is not None:
            return self._lease_answer(ended, already=ended.how == "released", released=0, session_ids=[])
        lease = self.leases.lease(read_id)
        sids = self.leases.finish(read_id, "released")
        return self._lease_answer(lease, already=False, released=len(sids), session_ids=sids)

    @staticmethod
    def _lease_answer(lease: Any, *, already: bool, **counts: Any) -> dict[str, Any]:
        """An ack's or release's answer: what it did (``counts``), what the read acknowledged and lost."""
        return {"success": True, "read_id": lease.read_id, **counts, "already": already,
                "acknowledged_session_ids": list(lease.acknowledged), "taken_over": list(lease.taken)}
