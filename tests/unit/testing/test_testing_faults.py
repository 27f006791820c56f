"""dressage.testing's fault injection refuses what it cannot do, and does what it says on real handles."""

from __future__ import annotations

import numpy as np
import pytest

from dressage.errors import IntegrityError, TransferQueueError
from dressage.testing import corrupt_blob, kill_unit, serve_unit, unit_pid, wait_unit_state
from dressage.tq import TransferQueue
from dressage.tq.storage import MemoryStorageUnit, SpillStorageUnit


def test_embedded_units_have_no_process_to_signal():
    with TransferQueue.start({"num_storage_units": 2}) as tq:
        with pytest.raises(TransferQueueError, match="no unit process"):
            kill_unit(tq, "unit0")
        with pytest.raises(TransferQueueError, match="no StorageUnit 'unit9'"):
            unit_pid(tq, "unit9")
        assert sorted(tq.storage_units()) == ["unit0", "unit1"]


def test_the_controller_is_not_a_unit():
    with TransferQueue.start({"deployment": "local", "num_storage_units": 1, "retention_s": None}) as tq:
        with pytest.raises(TransferQueueError, match="no StorageUnit 'controller'"):
            kill_unit(tq, "controller")
        pid = unit_pid(tq, "unit0")
        assert pid == tq.processes()["unit0"] and pid != tq.processes()["controller"]


def test_corrupt_blob_flips_exactly_one_stored_byte():
    unit = MemoryStorageUnit("m", memory_budget=1 << 20, checksums=False)
    a = np.arange(64, dtype=np.uint8)
    unit.put("k", a)
    corrupt_blob(unit, "k", 10)
    out = unit.get("k")
    assert int(out[10]) == 10 ^ 0xFF
    np.testing.assert_array_equal(np.delete(out, 10), np.delete(a, 10))
    with pytest.raises(TransferQueueError, match="outside the 64 stored bytes"):
        corrupt_blob(unit, "k", 64)
    unit.close()


def test_corrupt_blob_refuses_remote_handles_and_copies(tmp_path):
    remote = serve_unit(MemoryStorageUnit("r", memory_budget=1 << 20))
    try:
        remote.put("k", np.zeros(8, dtype=np.uint8))
        with pytest.raises(TransferQueueError, match="remote handle"):
            corrupt_blob(remote, "k", 0)
    finally:
        remote.close()
    spill = SpillStorageUnit("s", memory_budget=16, spill_dir=str(tmp_path))
    assert spill.put("big", np.ones(1024, dtype=np.uint8)).spilled   # reads of a spilled key are fresh copies
    with pytest.raises(TransferQueueError, match="copies"):
        corrupt_blob(spill, "big", 0)
    np.testing.assert_array_equal(spill.get("big", 0, 4), [1, 1, 1, 1])
    spill.close()


def test_a_corrupted_key_in_an_embedded_deployment_is_an_integrity_error():
    with TransferQueue.start({"retention_s": None, "verify_local_reads": True}) as tq:
        client = tq.client()
        ref = client.put("logprobs", np.arange(1000, dtype=np.float32))
        corrupt_blob(tq.storage_units()[ref.unit_id], ref.key, 4 * 500)
        with pytest.raises(IntegrityError):
            client.get(ref)


def test_wait_unit_state_says_what_it_saw_when_it_times_out():
    with TransferQueue.start({}) as tq:
        wait_unit_state(tq, "unit0", "live", 1.0)   # returns: the unit is live
        with pytest.raises(AssertionError, match="unit0 not dead"):
            wait_unit_state(tq, "unit0", "dead", 0.05)
