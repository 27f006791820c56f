"""The in-process path of the client (embedded): one put or one ref read with no general machinery,
and the general path taking over whatever that path cannot finish at once."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dressage.errors import KeyNotFoundError, StorageFullError, TransferQueueError
from dressage.tq import TransferQueue
from dressage.tq.directory.entries import KeyState
from dressage.fields.refs import FieldRef


def test_an_embedded_put_and_get_take_the_in_process_path_with_the_same_refs_and_counters():
    with TransferQueue.start({"retention_s": None}) as tq:
        client = tq.client()
        assert client._inproc is not None
        a = np.arange(600, dtype=np.float32).reshape(200, 3)
        ref = client.put("logprobs", a, batch="s1")
        assert ref == FieldRef(key=ref.key, unit_id="unit0", field="logprobs", dtype="float32", shape=(200, 3),
                               batch="s1")
        assert (ref.row_start, ref.row_stop, ref.nbytes) == (0, 200, a.nbytes)
        assert tq.controller.state(ref.key) is KeyState.WRITTEN
        unit = tq.storage_units()["unit0"]
        assert unit.stats()["puts"] == 1 and unit.stats()["bytes_written"] == a.nbytes
        got = client.get(ref.narrow(10, 20))
        np.testing.assert_array_equal(got, a[10:20])
        assert not got.flags.writeable and client.get(ref, copy=True).flags.writeable
        assert client.get_many([ref], consume=True)[0].shape == (200, 3)
        assert tq.controller.state(ref.key) is KeyState.CONSUMED
        c = client.counters
        assert (c.puts, c.bytes_written, c.get_calls, c.get_requests, c.rows_read) == (1, 2400, 3, 3, 410)
        a[:] = -1                                      # the unit copied it: the caller may reuse its buffer
        assert client.get(ref)[0, 0] == 0.0
        with pytest.raises(TransferQueueError, match="already exists"):
            client.put("logprobs", a, key=ref.key)
        assert tq.controller.total_keys() == 1


def test_inputs_that_need_a_conversion_are_stored_once_and_read_back_equal():
    with TransferQueue.start({"retention_s": None}) as tq:
        client = tq.client()
        strided = np.arange(40, dtype=np.int64).reshape(10, 4)[:, ::2]   # not contiguous
        swapped = np.arange(6, dtype=">i4")                              # not native byte order
        for value in (strided, swapped, [[1, 2], [3, 4]]):
            ref = client.put("f", value)
            np.testing.assert_array_equal(client.get(ref), np.asarray(value))
        with pytest.raises(TransferQueueError, match="field"):
            client.put("", strided)
        with pytest.raises(TransferQueueError, match="batch"):
            client.put("f", strided, batch=3)
        assert tq.controller.total_keys() == 3


def test_a_failed_unit_write_leaves_nothing_in_the_directory():
    with TransferQueue.start({"retention_s": None}) as tq:
        client = tq.client()
        unit = tq.storage_units()["unit0"]

        def broken(key, array, *, copy=True):
            raise RuntimeError("disk on fire")

        unit.put_local = broken
        with pytest.raises(RuntimeError, match="disk on fire"):
            client.put("f", np.zeros(8))
        assert tq.controller.total_keys() == 0 and client.counters.puts == 0


def test_a_full_unit_hands_the_put_to_the_general_path_which_waits_for_space():
    config = {"retention_s": None, "on_full": "wait", "full_wait_s": 10, "unit_memory_budget": "1MiB"}
    with TransferQueue.start(config) as tq:
        client = tq.client()
        first = client.put("f", np.zeros(600 << 10, dtype=np.uint8), batch="old")
        timer = threading.Timer(0.3, client.clear, args=("old",))
        timer.start()
        ref = client.put("f", np.ones(600 << 10, dtype=np.uint8), batch="new")  # fits once "old" is cleared
        # It waited, and returned only once the clear had run: "old" is gone by the time the put is done.
        assert client.counters.full_waits >= 1 and tq.controller.state(first.key) is KeyState.CLEARED
        timer.join()
        assert client.get(ref)[0] == 1
    config["on_full"] = "error"
    with TransferQueue.start(config) as tq:
        client = tq.client()
        client.put("f", np.zeros(600 << 10, dtype=np.uint8))
        with pytest.raises(StorageFullError):
            client.put("f", np.zeros(600 << 10, dtype=np.uint8))
        assert tq.controller.total_keys() == 1


def test_a_ref_to_an_unknown_unit_or_a_cleared_key_fails_typed():
    with TransferQueue.start({"retention_s": None}) as tq:
        client = tq.client()
        ref = client.put("f", np.zeros(4), batch="b")
        with pytest.raises(KeyNotFoundError, match="'elsewhere'"):
            client.get(FieldRef(key=ref.key, unit_id="elsewhere", field="f", dtype="float64", shape=(4,)))
        client.clear("b")
        with pytest.raises(KeyNotFoundError, match=ref.key):
            client.get(ref)
        with pytest.raises(TransferQueueError, match="FieldRefs"):
            client.get_many(["not a ref"])


def test_one_unit_placement_without_a_pool_search_keeps_every_refusal():
    from dressage.errors import StorageUnitUnavailable
    from dressage.tq.directory.controller import Controller
    from dressage.tq.directory.entries import UnitInfo

    strict = Controller([UnitInfo("u0", memory_budget=100)], strict_budget=True)
    assert strict.place_many([("a", 60, "f")]) == "u0"
    with pytest.raises(StorageFullError, match="40 of 100 bytes free"):
        strict.place_many([("b", 41, "f")])
    assert strict.place_many([("b", 40, "f")]) == "u0"
    spilling = Controller([UnitInfo("u0", memory_budget=100)])
    assert spilling.place_many([("a", 500, "f")]) == "u0"   # over budget: the unit spills
    spilling.mark_unit_dead("u0", "gone")
    with pytest.raises(StorageUnitUnavailable, match="u0 dead"):
        spilling.place_many([("c", 1, "f")])
    assert strict.total_keys() == 2 and spilling.total_keys() == 1
