"""How many StorageUnits one ``get_many`` reads at once (``read_streams``): one after another on a host
with no core to spare, side by side up to the setting, every ref answered by its own unit either way."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dressage.errors import TransferQueueError
from dressage.tq import TransferQueue, TransferQueueClient
from dressage.tq.client import client as client_module


class _Across:
    """A unit of the embedded deployment seen as another process's: reads take a while and are watched."""

    remote = True

    def __init__(self, unit, watch: "_Watch") -> None:
        self._unit, self._watch = unit, watch
        self.unit_id = unit.unit_id

    def get_many(self, requests):
        with self._watch.reading(self.unit_id):
            time.sleep(0.05)
            return [np.array(a) for a in self._unit.get_many(requests)]

    def __getattr__(self, name):
        return getattr(self._unit, name)


class _Watch:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = self.most = 0
        self.reads: list[str] = []

    def reading(self, unit_id: str) -> "_Watch":
        with self._lock:
            self.reads.append(unit_id)
        return self

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.now -= 1


@pytest.fixture
def four_units():
    tq = TransferQueue.start({"deployment": "embedded", "num_storage_units": 4, "retention_s": None})
    try:
        writer = tq.client()
        arrays = [np.full((3, 5), i, dtype=np.int32) for i in range(8)]
        refs = [writer.put("f", a) for a in arrays]
        assert len({r.unit_id for r in refs}) == 4  # placed round robin over the four
        yield tq, refs, arrays
    finally:
        tq.shutdown()


def _reader(tq, read_streams):
    watch = _Watch()
    units = {uid: _Across(u, watch) for uid, u in tq.storage_units().items()}
    return TransferQueueClient(tq.controller, units, read_streams=read_streams), watch


@pytest.mark.parametrize("streams, most", [(1, 1), (2, 2), (4, 4), (16, 4)])
def test_a_read_asks_at_most_read_streams_units_at_once_and_each_ref_gets_its_own_rows(four_units, streams, most):
    tq, refs, arrays = four_units
    client, watch = _reader(tq, streams)
    try:
        got = client.get_many(refs)
    finally:
        client.close()
    assert watch.most == most
    assert sorted(watch.reads) == sorted(tq.storage_units())  # each unit asked once, for all of its refs
    for a, g in zip(arrays, got):
        assert np.array_equal(a, g)
    assert client.counters.get_requests == 4


def test_one_stream_reads_the_units_one_after_another_in_one_thread(four_units):
    tq, refs, _ = four_units
    client, watch = _reader(tq, 1)
    threads = set()
    for unit in client._units.values():
        inner = unit.get_many
        unit.get_many = lambda reqs, inner=inner: (threads.add(threading.get_ident()), inner(reqs))[1]
    try:
        client.get_many(refs)
    finally:
        client.close()
    assert threads == {threading.get_ident()} and watch.most == 1


def test_a_failing_unit_fails_the_read_with_its_error_whatever_the_lane(four_units):
    tq, refs, _ = four_units
    client, _ = _reader(tq, 2)
    bad = client._units[refs[3].unit_id]

    def broken(requests):
        raise TransferQueueError(f"StorageUnit {bad.unit_id} is broken")

    bad.get_many = broken
    try:
        with pytest.raises(TransferQueueError, match=bad.unit_id):
            client.get_many(refs)
    finally:
        client.close()


def test_the_default_is_one_stream_per_two_cpus_at_least_one(monkeypatch):
    for cpus, streams in ((1, 1), (2, 1), (3, 1), (4, 2), (16, 8), (96, 48)):
        monkeypatch.setattr(client_module.os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)))
        assert client_module.default_read_streams() == streams
    tq = TransferQueue.start({"deployment": "embedded"})
    try:
        client = TransferQueueClient(tq.controller, tq.storage_units())
        assert client.read_streams == 48
        client.close()
    finally:
        tq.shutdown()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_read_streams_must_be_a_positive_integer(bad):
    tq = TransferQueue.start({"deployment": "embedded"})
    try:
        with pytest.raises(TransferQueueError, match="read_streams"):
            TransferQueueClient(tq.controller, tq.storage_units(), read_streams=bad)
    finally:
        tq.shutdown()


@pytest.mark.timeout(120, method="thread")  # a deadlock would hang the process: end it instead
def test_many_async_reads_at_once_each_with_lanes_all_finish(four_units):
    """``aget_many`` runs ``get_many`` on the client's pool; the lanes it starts run on threads of their own,
    so twelve such reads at once (more than that pool's eight threads) never wait for lanes queued behind
    them."""
    import asyncio

    tq, refs, arrays = four_units
    client, watch = _reader(tq, 2)

    async def many() -> list:
        return await asyncio.wait_for(asyncio.gather(*(client.aget_many(refs) for _ in range(12))), 60)

    try:
        results = asyncio.run(many())
    finally:
        client.close()
    assert len(results) == 12 and all(np.array_equal(a, g) for got in results for a, g in zip(arrays, got))
    assert len(watch.reads) == 12 * 4
