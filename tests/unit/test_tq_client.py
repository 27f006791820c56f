"""Client behaviour on the embedded deployment (in-process units) and over ZMQ to the same process.

``ClientTests`` is the suite; each subclass decides how a client reaches the TransferQueue.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import numpy as np
import pytest

from dressage.errors import IntegrityError, KeyNotFoundError, ProtocolError, RowRangeError, StorageFullError
from dressage.tq import Controller, FieldRef, KeyState, TransferQueue, TransferQueueClient, UnitInfo


class ClientTests:
    """Subclasses set ``connect(tq) -> TransferQueueClient``."""

    def connect(self, tq: TransferQueue) -> TransferQueueClient:
        raise NotImplementedError

    @pytest.fixture
    def tq(self):
        with TransferQueue.start({"num_storage_units": 3, "unit_memory_budget": "64MiB",
                                  "request_timeout_s": 5}) as tq:
            yield tq

    @pytest.fixture
    def client(self, tq):
        client = self.connect(tq)
        yield client
        client.close()

    def test_put_returns_a_ref_and_get_many_restores_arrays_in_ref_order(self, client):
        lp = np.linspace(-3, 0, 64, dtype=np.float32)
        r3 = np.random.default_rng(1).integers(0, 255, size=(99, 4, 2)).astype(np.uint8)
        ref_lp = client.put("logprobs", lp, batch="b")
        ref_r3 = client.put("routed_experts", r3, batch="b")
        assert (ref_r3.dtype, ref_r3.shape, ref_r3.batch, ref_r3.field) == ("uint8", (99, 4, 2), "b", "routed_experts")
        got = client.get_many([ref_r3, ref_lp, ref_r3.narrow(5, 9)])
        np.testing.assert_array_equal(got[0], r3)
        np.testing.assert_array_equal(got[1], lp)
        np.testing.assert_array_equal(got[2], r3[5:9])

    def test_get_many_dedups_identical_requests_and_reads_only_requested_rows(self, tq, client):
        a = np.arange(1000 * 16, dtype=np.int32).reshape(1000, 16)
        ref = client.put("routed_experts", a)
        part = ref.narrow(100, 110)
        client.reset_counters()
        before = tq.stats()[ref.unit_id]
        got = client.get_many([part, part, ref.narrow(100, 110), part])
        after = tq.stats()[ref.unit_id]
        for g in got:
            np.testing.assert_array_equal(g, a[100:110])
        c = client.counters
        assert (c.get_requests, c.rows_read, c.bytes_read, c.refs_requested) == (1, 10, 10 * 64, 4)
        assert after["get_requests"] - before["get_requests"] == 1
        assert after["rows_read"] - before["rows_read"] == 10

    def test_one_round_trip_per_unit(self, tq, client):
        refs = [client.put("logprobs", np.full(8, i, dtype=np.float32)) for i in range(9)]
        assert len({r.unit_id for r in refs}) == 3  # equal units fill evenly
        client.reset_counters()
        got = client.get_many(refs)
        assert client.counters.get_requests == 3
        assert [int(g[0]) for g in got] == list(range(9))

    def test_no_reads_means_zero_counters(self, client):
        client.put("logprobs", np.zeros(4, dtype=np.float32))
        c = client.counters
        assert (c.get_requests, c.rows_read, c.bytes_read, c.puts) == (0, 0, 0, 1)

    def test_unknown_and_cleared_keys_are_key_not_found(self, client):
        ref = client.put("logprobs", np.zeros(4, dtype=np.float32), batch="b")
        ghost = dataclasses.replace(ref, key="never-written")
        with pytest.raises(KeyNotFoundError, match="never-written"):
            client.get_many([ref, ghost])
        assert client.clear("b") == 1
        with pytest.raises(KeyNotFoundError):
            client.get_many([ref])

    def test_ref_beyond_stored_rows_is_row_range_error(self, client):
        ref = client.put("logprobs", np.zeros(10, dtype=np.float32))
        forged = FieldRef(key=ref.key, unit_id=ref.unit_id, field=ref.field, dtype=ref.dtype, shape=(20,),
                          row_start=5, row_stop=15)
        with pytest.raises(RowRangeError):
            client.get_many([forged])

    def test_ref_with_a_wrong_dtype_is_integrity_error(self, client):
        ref = client.put("logprobs", np.zeros(10, dtype=np.float32))
        with pytest.raises(IntegrityError):
            client.get_many([dataclasses.replace(ref, dtype="int32")])

    def test_clear_after_consumption_leaves_zero_keys_in_every_unit(self, tq, client):
        refs = [client.put("routed_experts", np.ones((30, 2, 2), dtype=np.uint8), batch="step-1") for _ in range(7)]
        other = client.put("logprobs", np.ones(3, dtype=np.float32), batch="step-2")
        client.get_many(refs, consume=True)
        assert tq.controller.state(refs[0].key) is KeyState.CONSUMED
        assert client.clear("step-1") == 7
        stats = tq.stats()
        assert sum(s["keys"] for s in stats.values()) == 1
        assert client.delete([other]) == 1
        assert tq.total_keys() == 0
        assert all(s["keys"] == 0 and s["bytes"] == 0 for s in tq.stats().values())
        assert tq.controller.state(other.key) is KeyState.CLEARED

    def test_put_async_aput_and_aget_many(self, client):
        futures = [client.put_async("logprobs", np.full(5, i, dtype=np.float32)) for i in range(6)]
        refs = [f.result(timeout=10) for f in futures]

        async def go():
            ref = await client.aput("logprobs", np.arange(3, dtype=np.float32))
            return await client.aget_many([ref, *refs])

        got = asyncio.run(go())
        np.testing.assert_array_equal(got[0], np.arange(3))
        assert [int(g[0]) for g in got[1:]] == list(range(6))

    def test_concurrent_puts_from_many_threads(self, tq, client):
        sizes = [16, 300_000, 1000, 400_000] * 6  # small frames and shared-memory sized payloads
        futures = [client.put_async("routed_experts", np.full(n, i % 251, dtype=np.uint8), batch="c")
                   for i, n in enumerate(sizes)]
        refs = [f.result(timeout=30) for f in futures]
        got = client.get_many(refs)
        assert [(len(g), int(g[-1])) for g in got] == [(n, i % 251) for i, n in enumerate(sizes)]
        assert client.clear("c") == len(sizes) and tq.total_keys() == 0

    def test_copy_true_gives_writable_arrays(self, client):
        ref = client.put("logprobs", np.arange(4, dtype=np.float32))
        (view,) = client.get_many([ref])
        (own,) = client.get_many([ref], copy=True)
        assert not view.flags.writeable and own.flags.writeable
        own[:] = 7
        np.testing.assert_array_equal(client.get(ref), np.arange(4))

    def test_put_many_writes_one_step_to_one_unit(self, tq, client):
        lp = np.arange(7, dtype=np.float32)
        r3 = np.arange(7 * 4, dtype=np.uint8).reshape(7, 4)
        before = {u: s["puts"] for u, s in tq.stats().items()}
        refs = client.put_many([("logprobs", lp), ("routed_experts", r3)], batch="s")
        assert refs[0].unit_id == refs[1].unit_id and [r.field for r in refs] == ["logprobs", "routed_experts"]
        after = {u: s["puts"] for u, s in tq.stats().items()}
        assert after[refs[0].unit_id] - before[refs[0].unit_id] == 2
        got = client.get_many(refs)
        np.testing.assert_array_equal(got[0], lp)
        np.testing.assert_array_equal(got[1], r3)
        assert client.put_many([]) == []

    def test_bad_put_leaves_nothing_behind(self, tq, client):
        with pytest.raises(ProtocolError):
            client.put("logprobs", np.array([object()], dtype=object))
        assert tq.total_keys() == 0 and tq.controller.total_keys() == 0
        with pytest.raises(ProtocolError):
            client.put_many([("logprobs", np.zeros(3, dtype=np.float32)), ("x", np.array([None], dtype=object))])
        assert tq.total_keys() == 0 and tq.controller.total_keys() == 0


class TestEmbeddedClient(ClientTests):
    def connect(self, tq):
        return tq.client()


def test_full_unit_with_spill_disabled_is_storage_full_and_nothing_half_written():
    with TransferQueue.start({"unit_memory_budget": 1000, "on_full": "error"}) as tq:
        c = tq.client()
        c.put("logprobs", np.zeros(200, dtype=np.float32))
        with pytest.raises(StorageFullError):
            c.put("logprobs", np.zeros(200, dtype=np.float32))
        assert tq.total_keys() == 1 and tq.controller.total_keys() == 1
        assert tq.stats()["unit0"]["pending"] == 0
        with pytest.raises(StorageFullError):  # the first item fits, the second does not: neither stays
            c.put_many([("logprobs", np.zeros(10, dtype=np.float32)), ("logprobs", np.zeros(200, dtype=np.float32))])
        assert tq.total_keys() == 1 and tq.controller.total_keys() == 1


def test_on_full_wait_resumes_once_a_batch_is_cleared_and_times_out_otherwise():
    with TransferQueue.start({"unit_memory_budget": 1000, "on_full": "wait", "full_wait_s": 5}) as tq:
        c = tq.client()
        c.put("logprobs", np.zeros(200, dtype=np.float32), batch="old")
        threading.Timer(0.2, c.clear, args=("old",)).start()
        ref = c.put("logprobs", np.ones(200, dtype=np.float32), batch="new")
        np.testing.assert_array_equal(c.get(ref), np.ones(200))
    with TransferQueue.start({"unit_memory_budget": 1000, "on_full": "wait", "full_wait_s": 0.2}) as tq:
        c = tq.client()
        c.put("logprobs", np.zeros(200, dtype=np.float32))
        t0 = time.monotonic()
        with pytest.raises(StorageFullError):
            c.put("logprobs", np.zeros(200, dtype=np.float32))
        assert time.monotonic() - t0 < 3
        assert tq.total_keys() == 1


def test_spill_deployment_round_trip(tmp_path):
    with TransferQueue.start({"unit_memory_budget": 4096, "spill_dir": str(tmp_path)}) as tq:
        c = tq.client()
        arrays = [np.full((256, 2), i, dtype=np.int32) for i in range(5)]  # 2 KiB each
        refs = [c.put("routed_experts", a, batch="b") for a in arrays]
        s = tq.stats()["unit0"]
        assert s["spilled_bytes"] >= 3 * 2048 and s["memory_bytes"] <= 4096
        got = c.get_many([r.narrow(10, 20) for r in refs])
        for g, a in zip(got, arrays):
            np.testing.assert_array_equal(g, a[10:20])
        assert c.clear("b") == 5 and tq.total_keys() == 0
        assert not list((tmp_path / "unit0").glob("*.blob"))


def test_retention_clears_keys_nobody_consumed():
    with TransferQueue.start({"retention_s": 0.3}) as tq:
        c = tq.client()
        ref = c.put("logprobs", np.zeros(4, dtype=np.float32))
        deadline = time.monotonic() + 5
        while tq.total_keys() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tq.total_keys() == 0
        with pytest.raises(KeyNotFoundError):
            c.get(ref)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_retention_counts_from_the_last_write_or_read():
    clock = FakeClock()
    ctl = Controller([UnitInfo("u0")], retention_s=10, clock=clock)
    for key in ("unread", "read"):
        ctl.place(key, 10)
        ctl.commit(key)
    clock.now = 8.0
    ctl.mark_consumed(["read"])
    clock.now = 9.0
    ctl.place("late", 10)
    ctl.commit("late")
    clock.now = 10.5
    assert ctl.expire() == {"u0": ["unread"]}
    assert ctl.state("read") is KeyState.CONSUMED
    clock.now = 18.5
    assert ctl.expire() == {"u0": ["read"]}
    clock.now = 19.5
    assert ctl.expire() == {"u0": ["late"]}
    assert ctl.total_keys() == 0 and ctl.state("late") is KeyState.CLEARED
    assert ctl.take_deletions() == {"u0": ["late", "read", "unread"]}


def test_placement_prefers_the_writers_node_then_free_capacity():
    ctl = Controller([UnitInfo("a", "n0", 100), UnitInfo("b", "n1", 100), UnitInfo("c", "n1", 100)])
    assert ctl.place("k1", 60, node_id="n0") == "a"
    assert ctl.place("k2", 60, node_id="n0") in ("b", "c")  # a is out of room: free capacity wins
    assert ctl.place("k3", 10, node_id="n1") in ("b", "c")
    assert {ctl.place(f"x{i}", 1) for i in range(2)} <= {"b", "c"}


def test_aborted_key_rewritten_is_not_deleted_by_the_janitor():
    ctl = Controller([UnitInfo("u0")])
    ctl.place("k", 10)
    ctl.abort("k")
    ctl.place("k", 10)
    ctl.commit("k")
    assert ctl.take_deletions() == {}
class TestZmqClientToEmbedded(ClientTests):
    """``client_spec`` exposes the embedded deployment over ZMQ; the client talks only through sockets."""

    def connect(self, tq):
        client = TransferQueueClient.connect(tq.client_spec())
        assert all(u.remote for u in client._units.values())
        return client


