"""Payload integrity: every stored blob carries per-block checksums; a corrupted blob is IntegrityError."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dressage.errors import IntegrityError
from dressage.testing import corrupt_blob
from dressage.tq import TransferQueue
from dressage.tq.storage.integrity import BLOCK_BYTES, checksum, copy_and_checksum, verify_rows
from dressage.tq.storage import MemoryStorageUnit, SpillStorageUnit
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.storage.server import StorageUnitServer

ROW = 1024  # bytes per row of the test blobs: 256 rows per checksum block


def _blob(rows: int = 2048) -> np.ndarray:
    return np.random.default_rng(rows).integers(0, 255, size=(rows, 64, 16), dtype=np.uint8)


def test_block_checksums_match_a_plain_copy_and_detect_one_flipped_byte():
    a = _blob()
    dst = np.empty_like(a)
    sums = copy_and_checksum(dst, a)
    np.testing.assert_array_equal(dst, a)
    assert sums.block_rows == BLOCK_BYTES // ROW and len(sums.digests) == 2048 // sums.block_rows
    assert np.array_equal(sums.digests, checksum(a).digests)
    dst[1000, 3, 2] ^= 1
    verify_rows(dst, sums, 0, 512, "t")          # blocks 0 and 1: untouched
    with pytest.raises(IntegrityError, match=r"rows \[768, 1024\)"):
        verify_rows(dst, sums, 900, 901, "t")    # one row of the corrupted block is enough


@pytest.mark.parametrize("backend", [MemoryStorageUnit, SpillStorageUnit])
def test_corrupted_memory_blob_is_an_integrity_error_and_other_blocks_still_read(backend):
    unit = backend("c0", memory_budget=64 << 20)
    try:
        a = _blob()
        unit.put("k", a)
        unit.put("other", a[:10])
        corrupt_blob(unit, "k", 300 * ROW + 7)   # row 300: block 1
        with pytest.raises(IntegrityError, match="c0.*'k'"):
            unit.get("k")
        with pytest.raises(IntegrityError):
            unit.get("k", 299, 301)
        np.testing.assert_array_equal(unit.get("k", 0, 256), a[:256])    # block 0 is intact
        np.testing.assert_array_equal(unit.get("k", 512, 2048), a[512:])
        np.testing.assert_array_equal(unit.get("other"), a[:10])
    finally:
        unit.close()


def test_received_frames_kept_without_a_copy_are_checksummed_too():
    unit = MemoryStorageUnit("c1", memory_budget=64 << 20)
    a = _blob(512)
    frame = a.copy()
    unit.put("k", frame, copy=False)  # the server's path: the unit keeps the buffer it was given
    corrupt_blob(unit, "k", 5 * ROW)
    with pytest.raises(IntegrityError):
        unit.get("k", 5, 6)
    unit.close()


def test_corrupted_spill_file_is_an_integrity_error(tmp_path):
    unit = SpillStorageUnit("s0", memory_budget=1 << 20, spill_dir=str(tmp_path))
    try:
        a = _blob()                                # 2 MiB: over budget, spilled
        assert unit.put("k", a).spilled
        (path,) = [os.path.join(unit.spill_dir, n) for n in os.listdir(unit.spill_dir)]
        # The file holds the rows, then the checksum trailer (block_rows + one digest per block).
        assert os.path.getsize(path) == a.nbytes + 8 + 8 * 8
        np.testing.assert_array_equal(unit.get("k", 1000, 1010), a[1000:1010])
        with open(path, "r+b") as f:
            f.seek(1500 * ROW + 11)
            byte = f.read(1)
            f.seek(1500 * ROW + 11)
            f.write(bytes([byte[0] ^ 0x01]))
        with pytest.raises(IntegrityError, match="spilled key 'k'"):
            unit.get("k", 1500, 1501)
        with pytest.raises(IntegrityError):
            unit.get("k")
        np.testing.assert_array_equal(unit.get("k", 0, 1024), a[:1024])  # other blocks still verify
        with open(path, "r+b") as f:
            f.truncate(a.nbytes - 100)
        with pytest.raises(IntegrityError, match="truncated"):
            unit.get("k", 2040, 2048)
    finally:
        unit.close()


def test_a_removed_spill_file_is_an_integrity_error_naming_unit_key_and_file(tmp_path):
    unit = SpillStorageUnit("s0", memory_budget=1 << 20, spill_dir=str(tmp_path))
    try:
        assert unit.put("k", _blob()).spilled and unit.put("j", _blob()).spilled
        path = os.path.join(unit.spill_dir, "0.blob")
        os.unlink(path)
        with pytest.raises(IntegrityError, match=rf"unit s0: spilled blob of key 'k' cannot be read from {path}"):
            unit.get("k", 0, 10)
        assert unit.get("j", 0, 10).shape[0] == 10  # the other spilled key still reads
        assert unit.delete(["k"]) == 1  # and the lost one can still be deleted
    finally:
        unit.close()


@pytest.mark.parametrize("deployment", ["embedded", "local"])
def test_a_removed_spill_file_reads_as_integrity_error_in_every_deployment(tmp_path, deployment):
    with TransferQueue.start({"deployment": deployment, "unit_memory_budget": "1MiB",
                              "spill_dir": str(tmp_path)}) as tq:
        client = tq.client()
        refs = [client.put("x", np.full(600_000, i, np.int32)) for i in range(3)]
        spilled = sorted(os.listdir(tmp_path / "unit0"))
        assert spilled
        os.unlink(tmp_path / "unit0" / spilled[0])
        with pytest.raises(IntegrityError, match="cannot be read from"):
            client.get_many(refs)


def test_integrity_error_crosses_the_wire_typed_and_the_unit_keeps_serving():
    backend = MemoryStorageUnit("w0", memory_budget=64 << 20)
    server = StorageUnitServer(backend, shared_memory=False).start()
    remote = RemoteStorageUnit("w0", server.address, timeout_s=5)
    try:
        a = _blob(600)
        remote.put("k", a)
        remote.put("ok", a[:3])
        corrupt_blob(backend, "k", 10)
        with pytest.raises(IntegrityError, match="checksum mismatch"):
            remote.get("k", 0, 1)
        np.testing.assert_array_equal(remote.get("ok"), a[:3])
    finally:
        remote.close()
        server.stop()
        backend.close()


def test_client_reads_of_a_corrupted_key_raise_and_never_return_data():
    with TransferQueue.start({"retention_s": None, "verify_local_reads": True}) as tq:
        client = tq.client()
        a = _blob(300)
        ref = client.put("routed_experts", a)
        corrupt_blob(tq.storage_units()[ref.unit_id], ref.key, 299 * ROW)
        np.testing.assert_array_equal(client.get(ref.narrow(0, 200)), a[:200])
        with pytest.raises(IntegrityError):
            client.get_many([ref.narrow(0, 200), ref.narrow(250, 300)])


def test_checksums_can_be_switched_off_for_measurement_only(tmp_path):
    for backend in (MemoryStorageUnit("n0", memory_budget=4 << 20, checksums=False),
                    SpillStorageUnit("n1", memory_budget=1 << 20, spill_dir=str(tmp_path), checksums=False)):
        a = _blob()                                  # 2 MiB: spilled by the spilling unit
        backend.put("k", a)
        np.testing.assert_array_equal(backend.get("k", 7, 9), a[7:9])
        backend.close()
    with TransferQueue.start({"checksums": False, "retention_s": None}) as tq:
        assert tq.storage_units()["unit0"].checksums is False


@pytest.mark.parametrize("shape", [(1,), (7, 3), (300, 40, 8), (2049, 64, 16), (5000, 333), (9000, 40, 8)])
@pytest.mark.parametrize("dtype", [np.uint8, np.int32])
def test_copy_and_checksum_agrees_with_checksum_across_pieces(shape, dtype):
    """Pieces of COPY_BYTES that do not divide the payload, a last block shorter than the others, rows
    whose size does not divide BLOCK_BYTES: the copy is exact and every digest is checksum()'s."""
    a = np.random.default_rng(sum(shape)).integers(0, 100, size=shape).astype(dtype)
    dst = np.empty_like(a)
    sums = copy_and_checksum(dst, a)
    np.testing.assert_array_equal(dst, a)
    want = checksum(a)
    assert sums.block_rows == want.block_rows
    np.testing.assert_array_equal(sums.digests, want.digests)
