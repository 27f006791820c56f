"""The in-process read path: checksums computed in the copy, and which reads verify them.

In-process reads of blobs the unit copied into its own read-only memory skip re-verification unless
``verify_local_reads`` is set; reads served to another process, spill file reads and blobs the unit
kept without copying are verified on every read regardless.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import xxhash

from dressage.errors import ConfigError, IntegrityError
from dressage.testing import corrupt_blob
from dressage.tq import TransferQueue, TransferQueueClient, TransferQueueConfig
from dressage.tq.storage.integrity import BLOCK_BYTES, checksum
from dressage.tq.storage import MemoryStorageUnit, SpillStorageUnit


def _blob(rows: int, row_shape: tuple[int, ...] = (64, 16), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, size=(rows, *row_shape), dtype=np.uint8)


@pytest.mark.parametrize("array", [
    _blob(2048),                                                   # 8 whole blocks of 256 rows
    _blob(1000),                                                   # a short last block
    _blob(3, (7,)),                                                # one block, smaller than a block
    np.arange(300_000, dtype=np.float64).reshape(100_000, 3),      # rows that do not divide a block
    _blob(0),                                                      # no rows at all
])
def test_the_checksum_computed_in_the_copy_is_that_of_the_stored_data(array):
    unit = MemoryStorageUnit("c0", memory_budget=64 << 20)
    try:
        unit.put("k", array)
        stored = unit.get("k")
        np.testing.assert_array_equal(stored, array)
        sums = unit._sums["k"]
        assert sums.block_rows == checksum(array).block_rows
        assert sums.digests.tolist() == checksum(array).digests.tolist()
        # Independently: xxh3-64 of each block's bytes, blocks of whole rows of about BLOCK_BYTES.
        row_bytes = array.nbytes // len(array) if len(array) else 0
        flat = array.tobytes()
        step = sums.block_rows * row_bytes
        expect = [xxhash.xxh3_64_intdigest(flat[i:i + step]) for i in range(0, len(flat), step)] if step else []
        assert sums.digests.tolist() == expect
        if len(array):
            assert sums.block_rows == max(1, BLOCK_BYTES // row_bytes)
    finally:
        unit.close()


def test_local_reads_skip_the_verify_pass_by_default_and_the_serving_path_does_not():
    unit = MemoryStorageUnit("l0", memory_budget=64 << 20)
    a = _blob(600)
    unit.put("k", a)
    corrupt_blob(unit, "k", 10)
    (view,) = unit.read_local([("k", 0, None)])          # the in-process client's read: a view, not hashed
    assert view[0, 0, 10] == a[0, 0, 10] ^ 0xFF and not view.flags.writeable
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        unit.get_many([("k", 0, None)])                   # what a unit server sends to other processes
    unit.verify_local_reads = True
    with pytest.raises(IntegrityError, match="l0.*'k'"):
        unit.read_local([("k", 0, 1)])
    np.testing.assert_array_equal(unit.read_local([("k", 256, 600)])[0], a[256:])  # other blocks read
    unit.close()


def test_blobs_kept_without_a_copy_are_verified_on_local_reads_too():
    unit = MemoryStorageUnit("a0", memory_budget=64 << 20)
    a = _blob(512)
    unit.put("frame", a.copy(), copy=False)   # a received frame / adopted segment: written by another process
    unit.put("copied", a)
    corrupt_blob(unit, "frame", 5 * 1024)
    corrupt_blob(unit, "copied", 5 * 1024)
    with pytest.raises(IntegrityError, match="'frame'"):
        unit.read_local([("frame", 5, 6)])
    assert unit.read_local([("copied", 5, 6)])[0][0, 0, 0] == a[5, 0, 0] ^ 0xFF
    unit.delete(["frame"])
    unit.put("frame", a, copy=True)           # the same key name copied in now: the local policy applies
    assert not unit._adopted
    unit.close()


@pytest.mark.parametrize("verify", [False, True])
def test_embedded_client_follows_verify_local_reads(verify):
    with TransferQueue.start({"retention_s": None, "verify_local_reads": verify}) as tq:
        client = tq.client()
        a = _blob(300)
        ref = client.put("routed_experts", a)
        unit = tq.storage_units()[ref.unit_id]
        assert unit.verify_local_reads is verify
        corrupt_blob(unit, ref.key, 299 * 1024)
        np.testing.assert_array_equal(client.get(ref.narrow(0, 200)), a[:200])  # block 0 is intact
        if verify:
            with pytest.raises(IntegrityError):
                client.get(ref)
        else:
            got = client.get(ref)
            assert got[299, 0, 0] == a[299, 0, 0] ^ 0xFF and np.array_equal(got[:299], a[:299])


def test_a_corrupted_blob_read_from_another_process_is_caught_with_local_verification_off():
    with TransferQueue.start({"retention_s": None, "verify_local_reads": False, "shared_memory": False}) as tq:
        local = tq.client()
        a = _blob(600)
        ref = local.put("routed_experts", a)
        corrupt_blob(tq.storage_units()[ref.unit_id], ref.key, 300 * 1024)
        remote = TransferQueueClient.connect(tq.client_spec())   # over ZMQ, as another process reads
        try:
            np.testing.assert_array_equal(remote.get(ref.narrow(0, 256)), a[:256])
            with pytest.raises(IntegrityError, match="checksum mismatch"):
                remote.get(ref)
        finally:
            remote.close()
        assert local.get(ref)[300, 0, 0] == a[300, 0, 0] ^ 0xFF   # in-process: the policy's view


def test_a_corrupted_spill_file_is_caught_by_the_embedded_client_with_local_verification_off(tmp_path):
    config = {"retention_s": None, "verify_local_reads": False, "on_full": "spill",
              "unit_memory_budget": "1MiB", "spill_dir": str(tmp_path)}
    with TransferQueue.start(config) as tq:
        client = tq.client()
        a = _blob(2048)                                           # 2 MiB: over the budget, spilled
        ref = client.put("routed_experts", a)
        unit = tq.storage_units()[ref.unit_id]
        assert isinstance(unit, SpillStorageUnit) and unit.verify_local_reads is False
        assert tq.stats()[ref.unit_id]["spilled_bytes"] == a.nbytes
        (path,) = [os.path.join(unit.spill_dir, n) for n in os.listdir(unit.spill_dir)]
        with open(path, "r+b") as f:
            f.seek(1500 * 1024 + 3)
            byte = f.read(1)
            f.seek(1500 * 1024 + 3)
            f.write(bytes([byte[0] ^ 0x10]))
        with pytest.raises(IntegrityError, match="spilled key"):
            client.get(ref)
        np.testing.assert_array_equal(client.get(ref.narrow(0, 1024)), a[:1024])


def test_verify_local_reads_is_a_checked_boolean_off_by_default():
    assert TransferQueueConfig().verify_local_reads is False
    assert TransferQueueConfig(verify_local_reads=True).verify_local_reads is True
    with pytest.raises(ConfigError, match="transfer_queue.verify_local_reads"):
        TransferQueueConfig(verify_local_reads="yes")
