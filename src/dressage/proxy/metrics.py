"""The Proxy's Prometheus metrics (``GET /metrics``).

Everything but the per-call histograms is read at scrape time from what the Proxy already keeps: the
sessions (by state, steps, tokens), the session book's call counters, the pause, the finalized
Segments not yet read, the journal, the TransferQueue client's counters and, in an embedded deployment,
its StorageUnits' stats. The histograms (whole call, the Proxy's own share of it, the engine wait) are
observed once per call by the HTTP app, from the engine-wait tally the call already keeps; the TQ write
and commit histograms once per step written behind its answer; the group wait once per prompt group a
batch read hands over; the journal's fsync once per fsync of an append.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Mapping

import numpy as np
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from dressage.observe.metrics import ReadOnScrape, Sample
from dressage.serving import GC_PAUSES
from dressage.tq.metrics import client_samples, unit_samples

__all__ = ["ProxyMetrics", "CALL_BUCKETS_S", "FSYNC_BUCKETS_S", "GROUP_WAIT_BUCKETS_S"]

CALL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                  300.0)
"""Bucket bounds (seconds) of the call histograms: a millisecond of Proxy work up to a long generation."""

FSYNC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Bucket bounds (seconds) of the journal's fsyncs: a page-cache flush on NVMe up to a stalled disk."""

GROUP_WAIT_BUCKETS_S = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
"""Bucket bounds (seconds) of the group wait: siblings finishing together up to a straggler's time-out."""


class ProxyMetrics:
    """One Proxy's registry: a collector reading ``service`` at scrape time, and the call histograms."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ReadOnScrape(self._read))
        self.units: Callable[[], Mapping[str, Any]] | None = None
        """The StorageUnits of an embedded TransferQueue (in this process), whose stats are shown here too."""
        self.call_seconds = Histogram(
            "dressage_call_seconds", "Model calls: seconds from the request to the end of the answer.",
            buckets=CALL_BUCKETS_S, registry=self.registry)
        self.proxy_seconds = Histogram(
            "dressage_proxy_seconds", "Model calls: seconds of the call not spent waiting on the engine.",
            buckets=CALL_BUCKETS_S, registry=self.registry)
        self.engine_wait_seconds = Histogram(
            "dressage_engine_wait_seconds", "Model calls: seconds with at least one engine request outstanding.",
            buckets=CALL_BUCKETS_S, registry=self.registry)

        self.tq_write_seconds = Histogram(
            "dressage_tq_write_seconds", "Steps written behind their answer: seconds from the submit to the "
            "TransferQueue write landing (batching included).", buckets=CALL_BUCKETS_S, registry=self.registry)
        self.commit_seconds = Histogram(
            "dressage_commit_seconds", "Steps written behind their answer: seconds of the local commit (journal "
            "and insert) once their keys were written.", buckets=CALL_BUCKETS_S, registry=self.registry)
        service.core.write_behind.observe = self.observe_write
        self.group_wait_seconds = Histogram(
            "dressage_group_wait_seconds", "Prompt groups a batch read handed over: seconds from the group's first "
            "finalize to the read (once per group).", buckets=GROUP_WAIT_BUCKETS_S, registry=self.registry)
        service.trajectories.observe_group_wait = self.group_wait_seconds.observe
        self.journal_fsync_seconds = Histogram(
            "dressage_journal_fsync_seconds", "Journal appends: seconds of each fsync (with --journal).",
            buckets=FSYNC_BUCKETS_S, registry=self.registry)
        if service.core.journal is not None:
            self.watch_journal(service.core.journal)

    def watch_journal(self, journal: Any) -> None:
        """Observe each fsync of ``journal``'s appends (the journal the Proxy appends to from now on)."""
        journal.observe_fsync = self.journal_fsync_seconds.observe

    def observe_write(self, write_s: float, commit_s: float) -> None:
        """One step's TQ write and local commit (told by the write-behind, on its thread)."""
        self.tq_write_seconds.observe(write_s)
        self.commit_seconds.observe(commit_s)

    def observe_call(self, seconds: float, engine_s: float) -> None:
        """One model call served: ``seconds`` in all, ``engine_s`` of them waiting on the engine."""
        self.call_seconds.observe(seconds)
        self.engine_wait_seconds.observe(engine_s)
        self.proxy_seconds.observe(max(seconds - engine_s, 0.0))

    def render(self) -> bytes:
        """The exposition text of every metric now."""
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ read at scrape time
    def _read(self) -> Iterator[Sample]:
        service = self.service
        core, book, pause, done = service.core, service.book, service.pause, service.trajectories
        states: dict[str, int] = {"active": 0, "finalized": 0, "aborted": 0}
        steps = 0
        for s in list(core.sessions.values()):
            states[s.state] = states.get(s.state, 0) + 1
            steps += len(s.steps)
        for state, n in states.items():
            yield Sample("dressage_sessions", "Sessions the Proxy holds, by state.", n, {"state": state})
        yield Sample("dressage_steps", "StepRecords of the sessions the Proxy holds.", steps)
        yield Sample("dressage_calls_total", "Generations started (an engine call each).", book.calls, kind="counter")
        doc = "Requests answered with an error, by HTTP status and error code."
        yield Sample("dressage_failed_calls_total", doc, None, {"status": "", "code": ""}, "counter")
        for (status, code), n in list(book.failed_by.items()):
            yield Sample("dressage_failed_calls_total", doc, n, {"status": str(status), "code": code}, "counter")
        yield Sample("dressage_replayed_turns_total", "Transport retries answered from the record.", book.replayed_turns,
                     kind="counter")
        yield Sample("dressage_generated_tokens_total", "Response tokens of every recorded step.",
                     book.generated_tokens, kind="counter")
        yield Sample("dressage_trained_tokens_total", "Tokens under a loss mask of 1 in every Segment finalized.",
                     core.trained_tokens, kind="counter")
        offloaded = set(service.config.data_plane.offloaded) if service.config.data_plane.enable_transfer_queue \
            else set()
        for name, n in list(book.field_bytes.items()):
            yield Sample("dressage_field_bytes_total", "Bytes of the large fields recorded, by field and by "
                         "whether they went to the TransferQueue.", n,
                         {"field": name, "offloaded": "true" if name in offloaded else "false"}, "counter")
        yield Sample("dressage_calls_in_flight", "Model calls running now.", service.in_flight.total())
        yield Sample("dressage_evicted_sessions_total", "Sessions evicted idle or over the cap.",
                     book.keeper.evicted, kind="counter")
        yield Sample("dressage_weight_version", "The policy version new tokens are recorded with.",
                     service.weight_version)
        yield Sample("dressage_paused", "1 while every call is paused (a weight update), else 0.", int(pause.paused))
        yield Sample("dressage_paused_scopes", "Sessions and prompt instances paused on their own.", len(pause.scopes))
        yield Sample("dressage_pauses_total", "Pauses (global and scoped).", pause.pauses, kind="counter")
        paused_s = pause.paused_s
        if pause.paused_at is not None:
            paused_s += max(time.time() - pause.paused_at, 0.0)
        yield Sample("dressage_paused_seconds_total", "Seconds spent under a global pause.", paused_s, kind="counter")
        yield from self._unread(done)
        for e in service.engines.describe():
            labels = {"engine": str(e["url"])}
            yield Sample("dressage_engine_healthy", "1 while the engine is healthy.", int(bool(e["healthy"])), labels)
            yield Sample("dressage_engine_calls_total", "Calls placed on the engine.", e["calls"], labels, "counter")
        yield Sample("dressage_engine_moves_total", "Sessions moved to another engine.", len(service.engines.moves),
                     kind="counter")
        yield from self._journal(core.journal)
        gc_pauses = GC_PAUSES.snapshot()
        yield Sample("dressage_gc_collections_total", "Cyclic garbage collections since serving began (each one "
                     "pauses the event loop).", gc_pauses["collections"], kind="counter")
        yield Sample("dressage_gc_pause_seconds_total", "Seconds the cyclic garbage collector held the process "
                     "since serving began.", gc_pauses["pause_s"], kind="counter")
        yield Sample("dressage_gc_max_pause_seconds", "The longest cyclic garbage collection since serving began.",
                     gc_pauses["max_pause_ms"] / 1e3)
        tq = core.tq
        if tq is not None and hasattr(tq, "counters"):
            yield from client_samples(tq.counters.as_dict())
        if self.units is not None:
            for unit in self.units().values():
                yield from unit_samples(unit.stats())

    def _unread(self, done: Any) -> Iterator[Sample]:
        finalized = list(done.finalized.values())
        segments = [seg for d in finalized for seg in d.segments]
        yield Sample("dressage_unread_trajectories", "Finalized sessions the trainer has not read.", len(finalized))
        yield Sample("dressage_unread_segments", "Segments of finalized sessions the trainer has not read.",
                     len(segments))
        yield Sample("dressage_leased_reads", "Reads handed out and not acknowledged yet.", len(done.leases))
        yield Sample("dressage_expired_leases_total", "Read leases that ran out.", done.leases.expired, kind="counter")
        spans = [span for span in (seg.version_span() for seg in segments) if span is not None]
        yield Sample("dressage_token_version_span", "Widest policy-version span (max - min) of the trained tokens "
                     "of one unread Segment.", max((hi - lo for lo, hi in spans), default=0))
        ages = [d.finalized_at for d in finalized]
        yield Sample("dressage_oldest_unread_seconds", "Age of the oldest finalized session the trainer has not "
                     "read (0 when none waits).", max(time.monotonic() - min(ages), 0.0) if ages else 0.0)
        yield Sample("dressage_unread_trained_tokens", "Trained tokens of the unread Segments.",
                     sum(int(np.count_nonzero(seg.loss_mask)) for seg in segments))

    def _journal(self, journal: Any) -> Iterator[Sample]:
        replay_s = getattr(self.service, "replay_s", None)
        if replay_s is not None:
            yield Sample("dressage_journal_replay_seconds", "Seconds the start-up replay of the journal took.", replay_s)
        if journal is None:
            return
        yield Sample("dressage_journal_bytes", "Bytes of the journal file.", journal.size)
