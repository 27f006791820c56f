"""Prometheus exposition shared by the Proxy and the TransferQueue processes.

Metrics are read at scrape time from the counters each component already keeps (:class:`ReadOnScrape`
turns one ``read()`` of them into metric families), so the hot paths pay nothing for them; only the
per-call histograms observe on the call path. Each component has its own ``CollectorRegistry`` (several
Proxies or units may share a process in tests and ``dressage run``). :func:`serve_metrics` serves one on
a port of its own, the way the Controller and each StorageUnit process expose theirs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server

from dressage.errors import ConfigError

__all__ = ["Sample", "ReadOnScrape", "MetricsEndpoint", "serve_metrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(slots=True)
class Sample:
    """One value of a metric read at scrape time. ``kind``: ``counter`` (name ends ``_total``) or ``gauge``;
    ``value`` ``None`` declares the family without a value (a labelled counter nothing has counted yet)."""

    name: str
    doc: str
    value: float | None
    labels: dict[str, str] = field(default_factory=dict)
    kind: str = "gauge"


class ReadOnScrape:
    """A collector whose ``read()`` returns :class:`Sample` values; samples of one name become one family."""

    def __init__(self, read: Callable[[], Iterable[Sample]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for s in self._read():
            fam = families.get(s.name)
            if fam is None:
                names = sorted(s.labels)
                if s.kind == "counter":
                    fam = CounterMetricFamily(s.name.removesuffix("_total"), s.doc, labels=names)
                else:
                    fam = GaugeMetricFamily(s.name, s.doc, labels=names)
                families[s.name] = fam
            if s.value is not None:
                fam.add_metric([s.labels[k] for k in sorted(s.labels)], float(s.value))
        yield from families.values()

    def describe(self) -> list[Metric]:
        return []  # read at scrape time: nothing to check when it is registered


@dataclass(slots=True)
class MetricsEndpoint:
    """A metrics HTTP server on its own thread; ``url`` is where ``GET /metrics`` answers."""

    url: str
    _server: Any
    _thread: threading.Thread

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> MetricsEndpoint:
    """Serve ``registry`` on ``host:port`` (0: a free port); the bind error is a ConfigError naming it."""
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigError(f"metrics port {host}:{port}: {exc.strerror or exc}") from exc
    bound = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    return MetricsEndpoint(f"http://{shown}:{bound}/metrics", server, thread)
