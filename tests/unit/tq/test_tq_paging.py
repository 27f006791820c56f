"""Every call that carries keys pages through any number of them under the wire's per-request bound.

The bound (``wire.MAX_KEYS``) is set low here, on both ends of each call at once (the client and the
servers run in this process): a request of more keys than it is refused, so every path below passing
proves it was paged. The rollout case keeps the real bound and crosses it with 131,072 keys.
"""

from __future__ import annotations

import dataclasses

import time

import numpy as np
import pytest

from dressage.errors import ProtocolError
from dressage.tq import TransferQueue
from dressage.tq.client.client import TransferQueueClient
from dressage.tq.directory.entries import KeyState
from dressage.tq.directory.janitor import Janitor
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.transport import wire
from dressage.tq.transport.zmq import RpcClient
from dressage.train import TrainingReader, release_batch
from dressage.train.reader import ReadPlan

LIMIT = 7


@pytest.fixture
def small_limit(monkeypatch):
    monkeypatch.setattr(wire, "MAX_KEYS", LIMIT)
    return LIMIT


@pytest.fixture
def tq():
    with TransferQueue.start({"deployment": "embedded", "num_storage_units": 2, "unit_memory_budget": "64MiB",
                              "retention_s": None}) as tq:
        tq._deployment.janitor.stop()  # each test runs the sweeps it checks itself
        yield tq


@pytest.fixture
def client(tq):
    client = TransferQueueClient.connect(tq.client_spec())
    assert all(u.remote for u in client._units.values())
    yield client
    client.close()


def _put(tq, client, items, batch=None):
    """``client.put_many`` once every key's commit reached the directory (a leased put's commit rides on
    a later message, and a clear must not race it)."""
    refs = client.put_many(items, batch=batch)
    deadline = time.monotonic() + 10
    while any(tq.controller.state(r.key) is not KeyState.WRITTEN for r in refs):
        assert time.monotonic() < deadline, "commits never arrived"
        time.sleep(0.005)
    return refs


def _stored(tq) -> int:
    return sum(len(u.list()) for u in tq.storage_units().values())


class _Sizes:
    """Wraps a unit handle's ``delete`` to record how many keys each request carried."""

    remote = True

    def __init__(self, unit, fail_first: int = 0):
        self.unit, self.sizes, self.fail_first = unit, [], fail_first

    def delete(self, keys):
        keys = list(keys)
        self.sizes.append(len(keys))
        if self.fail_first:
            self.fail_first -= 1
            raise ConnectionError("unit went away")
        return self.unit.delete(keys)


def test_a_request_over_the_bound_is_refused(tq, small_limit):
    client = TransferQueueClient.connect(tq.client_spec())
    try:
        handle = next(iter(client._units.values()))
        rpc: RpcClient = handle._rpc
        keys = [f"k{i}" for i in range(LIMIT + 1)]
        with pytest.raises(ProtocolError, match=f"at most {LIMIT}"):
            rpc.call("delete", {"keys": keys}, keys=keys)
        with pytest.raises(ProtocolError, match=f"at most {LIMIT}"):
            client._controller._rpc.call("where", {"keys": keys}, keys=keys)
    finally:
        client.close()


def test_put_get_mark_move_delete_page_past_the_bound(tq, client, small_limit):
    n = 5 * LIMIT + 3
    items = [("lp", np.arange(i, i + 4 + i % 3, dtype=np.float32)) for i in range(n)]
    refs = _put(tq, client, items, batch="b0")
    assert len(refs) == n == tq.controller.total_keys() == _stored(tq)
    got = client.get_many(refs)
    for (_, want), have in zip(items, got):
        np.testing.assert_array_equal(have, want)
    # Row ranges of many keys in one get_many.
    got = client.get_many([dataclasses.replace(r, row_start=1, row_stop=3) for r in refs])
    for (_, want), have in zip(items, got):
        np.testing.assert_array_equal(have, want[1:3])
    assert client.mark_consumed(refs) == n
    assert client.set_batch(refs, "b1") == n
    assert client._controller.where([r.key for r in refs]) == {r.key: r.unit_id for r in refs}
    assert client.delete(refs) == n
    assert tq.controller.total_keys() == 0 and _stored(tq) == 0


def test_clear_pages_through_the_batch(tq, client, small_limit):
    n = 4 * LIMIT + 1
    _put(tq, client, [("r3", np.full((3, 2), i, dtype=np.uint8)) for i in range(n)], batch="rollout")
    _put(tq, client, [("lp", np.zeros(2, dtype=np.float32))], batch="other")
    assert client.clear("rollout") == n
    assert tq.controller.total_keys() == 1 and _stored(tq) == 1
    assert client.clear("rollout") == 0


def test_the_controllers_key_listing_pages_past_the_bound(tq, client, small_limit):
    n = 3 * LIMIT + 2
    refs = _put(tq, client, [("lp", np.full(2, i, dtype=np.float32)) for i in range(n)], batch="b")
    _put(tq, client, [("lp", np.zeros(2, dtype=np.float32)) for _ in range(2)], batch="other")
    remote = client._controller
    assert remote.keys("b") == [r.key for r in refs]
    assert len(remote.keys()) == n + 2
    # Each answer carries at most one page: the raw request for the listing answers LIMIT keys and
    # names where the next page starts.
    reply, _ = remote._rpc.call("keys", {"batch": "b"})
    assert len(reply["keys"]) == LIMIT and reply["next"] == LIMIT
    last, _ = remote._rpc.call("keys", {"batch": "b", "start": 3 * LIMIT})
    assert last["keys"] == [r.key for r in refs[3 * LIMIT:]] and last["next"] is None
    assert remote.keys("none") == []


def test_a_failed_clear_is_reported_and_retried_in_bounded_pages(tq, client, small_limit):
    n = 3 * LIMIT + 2
    refs = _put(tq, client, [("lp", np.ones(3, dtype=np.float32)) for _ in range(n)], batch="b")
    remotes = dict(client._units)
    uid = refs[0].unit_id
    flaky = _Sizes(remotes[uid], fail_first=1)
    client._units[uid] = flaky
    try:
        with pytest.raises(ConnectionError, match="went away"):
            client.clear("b")
    finally:
        client._units.update(remotes)
    # The directory forgot every key; the other pages were still deleted (and taken off the janitor's
    # queue), so only the page that failed is left on its unit, and queued.
    assert tq.controller.total_keys() == 0
    left = _stored(tq)
    assert 0 < left <= LIMIT
    assert sum(len(k) for k in tq.controller._to_delete.values()) == left
    assert flaky.sizes and all(s <= LIMIT for s in flaky.sizes)
    # The janitor deletes them over the wire, a bounded page per request.
    recorders = {u: _Sizes(h) for u, h in remotes.items()}
    janitor = Janitor(tq.controller, recorders.get, interval_s=60, reconcile_s=None)
    assert janitor.run_once() == left
    assert _stored(tq) == 0 and not tq.controller._to_delete
    sizes = [size for rec in recorders.values() for size in rec.sizes]
    assert sum(sizes) == left and max(sizes) <= LIMIT


def test_the_janitor_pages_a_queue_larger_than_the_bound_and_keeps_what_failed(tq, client, small_limit):
    n = 4 * LIMIT
    refs = _put(tq, client, [("lp", np.ones(2, dtype=np.float32)) for _ in range(n)])
    tq.controller.delete([r.key for r in refs])  # the directory forgets them ...
    for r in refs:  # ... and queues deletions larger than one request may carry
        tq.controller.requeue_deletions(r.unit_id, [r.key])
    recorders = {u: _Sizes(h) for u, h in client._units.items()}
    calls = {"n": 0}

    def resolve(uid):
        rec = recorders[uid]

        class Flaky:
            def delete(self, page):  # the second request of the sweep fails
                calls["n"] += 1
                if calls["n"] == 2:
                    raise ConnectionError("unit went away")
                return rec.delete(page)
        return Flaky()

    janitor = Janitor(tq.controller, resolve, interval_s=60, reconcile_s=None)
    first = janitor.run_once()
    queued = sum(len(k) for k in tq.controller._to_delete.values())
    # What was deleted stays deleted; from the failed page on, that unit's keys stay queued.
    assert first >= LIMIT and queued > 0 and first + queued == n == first + _stored(tq)
    assert janitor.run_once() == queued
    assert _stored(tq) == 0 and not tq.controller._to_delete
    assert all(s <= LIMIT for rec in recorders.values() for s in rec.sizes)


def test_a_put_that_fails_on_a_later_page_leaves_nothing(tq, client, small_limit, monkeypatch):
    calls = {"n": 0}
    real = RemoteStorageUnit._put_page

    def third_fails(self, items):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ConnectionError("unit went away")
        return real(self, items)

    monkeypatch.setattr(RemoteStorageUnit, "_put_page", third_fails)
    with pytest.raises(ConnectionError):
        client.put_many([("lp", np.ones(2, dtype=np.float32)) for _ in range(4 * LIMIT)], batch="b")
    tq.run_janitor()
    assert tq.controller.total_keys() == 0 and _stored(tq) == 0


@pytest.mark.slow
def test_a_rollout_of_65536_steps_records_restores_and_releases():
    """4,096 trajectories x 16 Steps, two keys each: 131,072 keys on one unit, past the real bound of one
    request on every path (the directory's and the unit's)."""
    steps, per_round = 65_536, 4_096
    assert 2 * steps > wire.MAX_KEYS
    lp, r3 = np.zeros(1, dtype=np.float32), np.zeros((1, 1, 1), dtype=np.uint8)
    with TransferQueue.start({"deployment": "embedded", "num_storage_units": 1, "unit_memory_budget": "256MiB",
                              "retention_s": None}) as tq:
        tq._deployment.janitor.stop()
        client = TransferQueueClient.connect(tq.client_spec())
        try:
            refs = []
            for _ in range(0, steps, per_round):
                items = [it for _ in range(per_round) for it in (("logprobs", lp), ("routed_experts", r3))]
                refs.extend(_put(tq, client, items, batch="rollout-0"))
            assert len(refs) == 2 * steps == tq.controller.total_keys() == _stored(tq)
            plan = ReadPlan({r.key: r for r in refs}, {r.key: 0 for r in refs}, len(refs))
            arrays, lost = TrainingReader(client)._read(plan)  # the restore's read: one get_many per unit
            assert not lost and len(arrays) == 2 * steps
            assert all(a.shape == r.shape for a, r in zip(arrays.values(), refs))
            assert release_batch(client, [r.key for r in refs]) == 2 * steps
            tq.run_janitor()
            assert tq.controller.total_keys() == 0 and _stored(tq) == 0
        finally:
            client.close()
