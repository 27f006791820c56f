"""Backpressure: a producer faster than its consumer fills the budget; units spill or puts wait, held
memory never exceeds the budget, and nothing is dropped."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest

from dressage.errors import StorageFullError
from dressage.tq import TransferQueue
from dressage.tq.storage import MemoryStorageUnit
from dressage.tq.transport import landing

KiB, MiB = 1 << 10, 1 << 20


def _blob(i: int, nbytes: int = 100 * KiB) -> np.ndarray:
    return np.full(nbytes, i % 251, dtype=np.uint8)


def test_wait_blocks_the_producer_until_the_consumer_frees_space_and_drops_nothing():
    n = 40                                             # 4 MB through a 1 MiB unit: four times its budget
    with TransferQueue.start({"unit_memory_budget": "1MiB", "on_full": "wait", "full_wait_s": 20,
                              "retention_s": None}) as tq:
        producer_client, consumer_client = tq.client(), tq.client()
        handoff: queue.Queue = queue.Queue()
        seen: list[int] = []

        def consume() -> None:
            for _ in range(n):
                i, ref = handoff.get(timeout=20)
                time.sleep(0.003)                      # training is the slow side
                a = consumer_client.get(ref)
                assert a.nbytes == 100 * KiB and int(a[0]) == i % 251 and int(a[-1]) == i % 251
                seen.append(i)
                consumer_client.delete([ref])

        consumer = threading.Thread(target=consume)
        consumer.start()
        for i in range(n):
            handoff.put((i, producer_client.put("routed_experts", _blob(i), batch="b")))
        consumer.join(timeout=30)
        stats = tq.stats()["unit0"]
        assert seen == list(range(n))                  # every put arrived, in order, intact
        assert producer_client.counters.full_waits > 0  # the producer really was held back
        assert stats["peak_held_bytes"] <= tq.config.budget_bytes
        assert stats["keys"] == 0 and tq.controller.total_keys() == 0


def test_wait_gives_up_after_full_wait_s_and_error_refuses_at_once_without_writing():
    for policy, wait_s in (("wait", 0.2), ("error", 30.0)):
        with TransferQueue.start({"unit_memory_budget": "1MiB", "on_full": policy, "full_wait_s": wait_s,
                                  "retention_s": None}) as tq:
            client = tq.client()
            refs = [client.put("x", _blob(i, 300 * KiB)) for i in range(3)]
            with pytest.raises(StorageFullError, match="full"):
                client.put("x", _blob(9, 300 * KiB))
            assert (client.counters.full_waits > 0) == (policy == "wait")   # waited, or refused at once
            stats = tq.stats()["unit0"]
            assert stats["keys"] == 3 and stats["puts"] == 3   # the refused payload never reached the unit
            assert tq.controller.total_keys() == 3
            assert stats["peak_held_bytes"] <= tq.config.budget_bytes
            client.delete(refs)


@pytest.mark.parametrize("deployment", ["embedded", "local"])
def test_a_put_larger_than_every_whole_budget_fails_at_once_without_waiting(deployment):
    with TransferQueue.start({"deployment": deployment, "unit_memory_budget": "1MiB", "on_full": "wait",
                              "full_wait_s": 30, "num_storage_units": 2}) as tq:
        client = tq.client()
        started = time.monotonic()
        with pytest.raises(StorageFullError, match="can never fit"):
            client.put("x", _blob(1, 2 * MiB))
        assert time.monotonic() - started < 5 and client.counters.full_waits == 0
        assert client.total_keys() == 0
        client.put("x", _blob(2, MiB))  # exactly a whole budget still fits


def test_spill_keeps_memory_under_the_budget_and_reads_everything_back(tmp_path):
    with TransferQueue.start({"unit_memory_budget": "1MiB", "on_full": "spill", "spill_dir": str(tmp_path),
                              "retention_s": None}) as tq:
        client = tq.client()
        refs = [client.put("routed_experts", _blob(i), batch="b") for i in range(40)]
        stats = tq.stats()["unit0"]
        assert stats["memory_bytes"] <= tq.config.budget_bytes
        assert stats["peak_held_bytes"] <= tq.config.budget_bytes
        assert stats["spilled_bytes"] == 40 * 100 * KiB - stats["memory_bytes"] > 0
        got = client.get_many(refs)
        assert [int(a[50_000]) for a in got] == [i % 251 for i in range(40)]
        assert client.clear("b") == 40 and tq.stats()["unit0"]["spilled_bytes"] == 0


def test_pooled_buffers_count_against_the_budget():
    unit = MemoryStorageUnit("p0", memory_budget=4 * MiB)
    try:
        for round_ in range(3):
            keys = [f"{round_}-{i}" for i in range(4)]
            for k in keys:                             # exactly the budget: pooled bytes must make way
                unit.put(k, np.ones(MiB, dtype=np.uint8))
            assert unit.usage()["held_bytes"] <= 4 * MiB
            unit.delete(keys)
            assert 0 < unit.usage()["pooled_bytes"] <= MiB
        assert unit.usage()["peak_held_bytes"] <= 4 * MiB
    finally:
        unit.close()


def test_a_pooled_size_taken_to_its_last_buffer_leaves_the_pool_before_eviction():
    # A reused 2 MiB buffer used to leave an empty 2 MiB list behind; eviction (largest size first)
    # then popped from it.
    unit = MemoryStorageUnit("p1", memory_budget=16 * MiB, checksums=False)
    unit._pool_cap = 16 * MiB
    try:
        unit.put("a", np.zeros(2 * MiB, dtype=np.uint8))
        unit.put("b", np.zeros(MiB, dtype=np.uint8))
        unit.delete(["a", "b"])                        # both buffers pooled
        unit.put("c", np.full(2 * MiB, 3, dtype=np.uint8))   # takes the only 2 MiB buffer
        assert unit.usage()["pooled_bytes"] == MiB
        unit.put("d", np.full(14 * MiB, 4, dtype=np.uint8))  # 2 + 14 MiB stored: the 1 MiB buffer must go
        usage = unit.usage()
        assert usage["pooled_bytes"] == 0 and usage["held_bytes"] == 16 * MiB
        assert int(unit.get("c")[0]) == 3 and int(unit.get("d")[-1]) == 4
    finally:
        unit.close()


def test_blob_buffers_land_past_a_page_boundary_and_keep_that_place_when_reused():
    """A unit's own buffers (what a socket receives into, what a put is copied into) start
    ``landing.OFFSET`` bytes into a page, reused ones too; a handed-over array too short for that view is
    stored as it is and never pooled."""
    unit = MemoryStorageUnit("p2", memory_budget=64 * MiB, checksums=False)
    try:
        received = unit.receive_buffer(3 * MiB)
        assert received.ctypes.data % landing.PAGE == landing.OFFSET
        received[:] = 5
        unit.put_many([("r", received)], copy=False)
        del received  # the unit's own now: no view of it is left outside
        unit.put("c", np.full(3 * MiB, 6, dtype=np.uint8))  # copied in
        assert unit.get("c").ctypes.data % landing.PAGE == landing.OFFSET
        places = {unit.get(k).ctypes.data for k in ("r", "c")}
        unit.delete(["r", "c"])
        assert unit.usage()["pooled_bytes"] == 6 * MiB
        again = [unit.receive_buffer(3 * MiB), unit.receive_buffer(3 * MiB)]
        assert {a.ctypes.data for a in again} == places and unit.usage()["pooled_bytes"] == 0
        # An array owning exactly its bytes (a caller's, handed over): no landing view fits in it.
        own = np.full(2 * MiB, 7, dtype=np.uint8)
        unit.put_many([("own", own)], copy=False)
        del own
        unit.delete(["own"])
        assert unit.usage()["pooled_bytes"] == 0
    finally:
        unit.close()
