"""The TransferQueue's Prometheus metrics, read at scrape time from the counters it already keeps.

:func:`unit_samples` reads a StorageUnit's ``stats()`` (served by each unit process, and by the Proxy for
the units of an embedded deployment), :func:`controller_samples` the Controller's per-unit directory,
lease and liveness state, :func:`client_samples` what one client moved. :func:`unit_registry` and
:func:`controller_registry` are what a unit's and the Controller's metrics port serve.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry

from dressage.observe.metrics import ReadOnScrape, Sample

__all__ = ["unit_samples", "controller_samples", "client_samples", "unit_registry", "controller_registry"]

_UNIT_GAUGES = (
    ("keys", "dressage_tq_unit_keys", "Keys the StorageUnit holds."),
    ("bytes", "dressage_tq_unit_bytes", "Payload bytes the StorageUnit holds (memory and spill)."),
    ("memory_bytes", "dressage_tq_unit_memory_bytes", "Payload bytes the StorageUnit holds in memory."),
    ("spilled_bytes", "dressage_tq_unit_spilled_bytes", "Payload bytes the StorageUnit spilled to disk."),
    ("memory_budget", "dressage_tq_unit_budget_bytes", "The StorageUnit's memory budget."),
    ("shm_bytes", "dressage_tq_unit_shm_bytes", "Bytes of the StorageUnit's /dev/shm segments."),
)
_UNIT_COUNTERS = (
    ("puts", "dressage_tq_unit_puts_total", "Keys written to the StorageUnit."),
    ("bytes_written", "dressage_tq_unit_put_bytes_total", "Payload bytes written to the StorageUnit."),
    ("get_requests", "dressage_tq_unit_get_requests_total", "Read requests the StorageUnit served."),
    ("bytes_read", "dressage_tq_unit_get_bytes_total", "Payload bytes read from the StorageUnit."),
    ("deletes", "dressage_tq_unit_deletes_total", "Keys deleted from the StorageUnit."),
)
_DIRECTORY = (
    ("directory_keys", "dressage_tq_directory_keys", "Keys the Controller places on the unit."),
    ("directory_bytes", "dressage_tq_directory_bytes", "Payload bytes the Controller places on the unit."),
    ("pending", "dressage_tq_pending_keys", "Keys placed on the unit whose write is not committed yet."),
    ("queued_deletes", "dressage_tq_queued_deletes", "Keys of the unit queued for deletion."),
    ("leases", "dressage_tq_leases", "Write leases that may place keys on the unit."),
    ("leased_bytes", "dressage_tq_leased_bytes", "Bytes of the unit reserved by write leases."),
)
_CLIENT = (
    ("puts", "dressage_tq_client_puts_total", "Keys this process wrote to the TransferQueue."),
    ("bytes_written", "dressage_tq_client_put_bytes_total", "Payload bytes this process wrote to the TransferQueue."),
    ("get_requests", "dressage_tq_client_get_requests_total", "Unit round trips of this process's reads."),
    ("bytes_read", "dressage_tq_client_get_bytes_total", "Payload bytes this process read from the TransferQueue."),
    ("deletes", "dressage_tq_client_deletes_total", "Keys this process deleted from the TransferQueue."),
    ("deletes_deferred", "dressage_tq_client_deletes_deferred_total",
     "Deleted keys whose unit did not answer the delete; the Controller's janitor deletes them."),
    ("full_waits", "dressage_tq_client_full_waits_total", "Puts that waited because every unit was full."),
)


def unit_samples(stats: Mapping[str, Any]) -> Iterator[Sample]:
    """A StorageUnit's metrics from its ``stats()`` (labelled with its unit id)."""
    labels = {"unit": str(stats.get("unit_id"))}
    for key, name, doc in _UNIT_GAUGES:
        if key in stats:
            yield Sample(name, doc, stats[key], labels)
    for key, name, doc in _UNIT_COUNTERS:
        if key in stats:
            yield Sample(name, doc, stats[key], labels, "counter")


def controller_samples(stats: Mapping[str, Mapping[str, Any]]) -> Iterator[Sample]:
    """The Controller's metrics from its per-unit ``stats()``."""
    dead = 0
    for uid, s in stats.items():
        labels = {"unit": str(uid)}
        for key, name, doc in _DIRECTORY:
            if key in s:
                yield Sample(name, doc, s[key], labels)
        live = s.get("state") == "live"
        dead += not live
        yield Sample("dressage_tq_unit_live", "1 while the Controller holds the unit live, 0 once it is dead.",
                     1 if live else 0, labels)
    yield Sample("dressage_tq_dead_units", "StorageUnits the Controller holds dead.", dead)


def client_samples(counters: Mapping[str, Any]) -> Iterator[Sample]:
    """What one TransferQueue client moved (its ``counters.as_dict()``)."""
    for key, name, doc in _CLIENT:
        if key in counters:
            yield Sample(name, doc, counters[key], kind="counter")


def unit_registry(stats: Callable[[], Mapping[str, Any]]) -> CollectorRegistry:
    """The registry a StorageUnit's metrics port serves: ``stats`` is the unit's ``stats()``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReadOnScrape(lambda: unit_samples(stats())))
    return registry


def controller_registry(stats: Callable[[], Mapping[str, Mapping[str, Any]]]) -> CollectorRegistry:
    """The registry the Controller's metrics port serves: ``stats`` is the Controller's ``stats()``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReadOnScrape(lambda: controller_samples(stats())))
    return registry
