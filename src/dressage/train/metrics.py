"""A training process's TransferQueue metrics: what its restores read and how long they took, and the
keys it released.

:class:`RestoreMetrics` is one registry of its own (a process may hold several trainers, as it holds
several Proxies in tests); :class:`~dressage.train.reader.TrainingReader` and
:func:`~dressage.train.reader.release_batch` count into it when given one, and :meth:`RestoreMetrics.serve`
exposes it on a port (the slime training ranks' ``dressage_metrics_port``).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from dressage.observe.metrics import MetricsEndpoint, ReadOnScrape, serve_metrics
from dressage.tq.metrics import client_samples

__all__ = ["RestoreMetrics", "RESTORE_BUCKETS_S"]

RESTORE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Bucket bounds (seconds) of one restore: a few keys of one unit up to a large batch over many."""


class RestoreMetrics:
    """The restore and release counters of one trainer; ``client`` (its TransferQueue client, optional)
    adds what that client moved (``dressage_tq_client_*``), read at scrape time."""

    def __init__(self, client: Any = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.restore_bytes = Counter(
            "dressage_tq_restore_bytes", "Payload bytes restores read from the TransferQueue.",
            registry=self.registry)
        self.restore_seconds = Histogram(
            "dressage_tq_restore_seconds", "Restores: seconds of the batched TransferQueue read of one shard.",
            buckets=RESTORE_BUCKETS_S, registry=self.registry)
        self.restored_refs = Counter(
            "dressage_tq_restored_refs", "TransferQueue keys restores read (a key several Segments share once).",
            registry=self.registry)
        self.restored_samples = Counter(
            "dressage_tq_restored_samples", "Samples whose large fields restores filled.", registry=self.registry)
        self.lost_refs = Counter(
            "dressage_tq_lost_refs", "TransferQueue keys a restore found lost (unit dead or key gone).",
            registry=self.registry)
        self.released_refs = Counter(
            "dressage_tq_released_refs", "TransferQueue keys deleted after their batch was trained.",
            registry=self.registry)
        if client is not None and hasattr(client, "counters"):
            self.registry.register(ReadOnScrape(lambda: client_samples(client.counters.as_dict())))

    def observe_restore(self, *, seconds: float, nbytes: int, refs: int, samples: int, lost: int = 0) -> None:
        """One restore that read ``refs`` keys (``nbytes`` in all) in ``seconds`` and filled ``samples``."""
        self.restore_seconds.observe(seconds)
        self.restore_bytes.inc(nbytes)
        self.restored_refs.inc(refs)
        self.restored_samples.inc(samples)
        if lost:
            self.lost_refs.inc(lost)

    def observe_release(self, keys: int) -> None:
        self.released_refs.inc(keys)

    def render(self) -> bytes:
        """The exposition text of every metric now."""
        return generate_latest(self.registry)

    def serve(self, host: str, port: int) -> MetricsEndpoint:
        """Serve ``GET /metrics`` on ``host:port`` (0: a free port) on a thread of its own."""
        return serve_metrics(self.registry, host, port)
