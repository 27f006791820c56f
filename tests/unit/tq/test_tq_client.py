"""Client behaviour on the embedded deployment (in-process units) and over ZMQ to the same process.

``dressage.testing.ClientTests`` is the suite; each subclass decides how a client reaches the TransferQueue.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dressage.errors import KeyNotFoundError, StorageFullError
from dressage.testing import ClientTests
from dressage.tq import Controller, KeyState, TransferQueue, TransferQueueClient, UnitInfo
from clocks import FakeClock


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
        with pytest.raises(StorageFullError):
            c.put("logprobs", np.zeros(200, dtype=np.float32))
        assert c.counters.full_waits >= 1   # it waited for space before giving up
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


