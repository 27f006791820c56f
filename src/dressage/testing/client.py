"""``ClientTests``: the conformance suite of a TransferQueue client and the deployment behind it.

Subclass it and define ``connect(tq)``, how a client reaches the running ``TransferQueue`` (the
in-process handle, ``TransferQueueClient.connect(tq.client_spec())`` over ZMQ, or a client of your own
with the same methods). ``tq_config()`` may change the deployment; the tests expect three units of
64 MiB. Checked: refs and restored arrays (dtype, shape, rows), dedup of identical reads and one
round trip per unit, typed errors for unknown keys, forged row ranges and wrong dtypes, consume / clear /
delete leaving zero keys, the async and concurrent paths, and that a bad put leaves nothing behind::

    from dressage.testing import ClientTests

    class TestMyClient(ClientTests):
        def connect(self, tq):
            return MyClient(tq.client_spec())
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest

from dressage.errors import IntegrityError, KeyNotFoundError, ProtocolError, RowRangeError
from dressage.tq import FieldRef, KeyState, TransferQueue, TransferQueueClient

__all__ = ["ClientTests"]


class ClientTests:
    """Subclasses define ``connect(tq) -> TransferQueueClient``; ``tq_config()`` may add settings (e.g. a
    ``local`` deployment) to the three 64 MiB units the tests expect."""

    def connect(self, tq: TransferQueue) -> TransferQueueClient:
        raise NotImplementedError(f"{type(self).__name__} must define connect(tq)")

    def tq_config(self) -> dict[str, Any]:
        return {}

    @pytest.fixture
    def tq(self):
        config = {"num_storage_units": 3, "unit_memory_budget": "64MiB", "request_timeout_s": 5,
                  **self.tq_config()}
        with TransferQueue.start(config) as tq:
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
