"""One conformance suite, ``StorageUnitTests``, that every StorageUnit backend's test class subclasses."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from dressage.errors import KeyNotFoundError, ProtocolError, RowRangeError, StorageFullError, TransferQueueError
from dressage.tq.storage import MemoryStorageUnit, SpillStorageUnit, StorageUnit

MiB = 1 << 20


class StorageUnitTests:
    """Behaviour every backend must have. Subclasses provide ``make_unit(memory_budget)``."""

    def make_unit(self, memory_budget: int) -> StorageUnit:
        raise NotImplementedError

    @pytest.fixture
    def unit(self):
        unit = self.make_unit(8 * MiB)
        yield unit
        unit.close()

    @pytest.mark.parametrize("dtype", ["float32", "uint8", "uint16", "int32", "int8", "bool", "float64"])
    def test_put_get_round_trip_keeps_dtype_shape_and_values(self, unit, dtype):
        rng = np.random.default_rng(0)
        a = (rng.integers(0, 200, size=(17, 3, 4)) % (2 if dtype == "bool" else 200)).astype(dtype)
        info = unit.put("k", a)
        assert (info.dtype, info.shape, info.nbytes) == (dtype, (17, 3, 4), a.nbytes)
        out = unit.get("k")
        assert out.dtype == np.dtype(dtype) and out.shape == a.shape
        np.testing.assert_array_equal(out, a)

    def test_get_reads_only_the_requested_rows(self, unit):
        a = np.arange(100 * 8, dtype=np.int32).reshape(100, 8)
        unit.put("k", a)
        before = unit.stats()
        out = unit.get("k", 10, 13)
        np.testing.assert_array_equal(out, a[10:13])
        after = unit.stats()
        assert after["rows_read"] - before["rows_read"] == 3
        assert after["bytes_read"] - before["bytes_read"] == 3 * 8 * 4

    def test_get_many_returns_requests_in_order(self, unit):
        a, b = np.arange(10, dtype=np.float32), np.arange(5, dtype=np.uint8)
        unit.put("a", a)
        unit.put("b", b)
        got = unit.get_many([("b", 1, 3), ("a", 0, None), ("a", 9, 10)])
        np.testing.assert_array_equal(got[0], b[1:3])
        np.testing.assert_array_equal(got[1], a)
        np.testing.assert_array_equal(got[2], a[9:10])

    def test_empty_blob_and_empty_range(self, unit):
        unit.put("e", np.zeros((0, 4, 2), dtype=np.uint8))
        assert unit.get("e").shape == (0, 4, 2)
        unit.put("f", np.arange(6, dtype=np.int32))
        assert unit.get("f", 3, 3).shape == (0,)

    def test_missing_key_is_key_not_found(self, unit):
        with pytest.raises(KeyNotFoundError, match="nope"):
            unit.get("nope")
        unit.put("a", np.arange(3, dtype=np.int32))
        with pytest.raises(KeyNotFoundError, match="nope"):
            unit.get_many([("a", 0, 1), ("nope", 0, 1)])

    def test_rows_outside_the_blob_are_row_range_error(self, unit):
        unit.put("a", np.arange(10, dtype=np.int32))
        for start, stop in [(0, 11), (5, 4), (-1, 3), (11, 12)]:
            with pytest.raises(RowRangeError):
                unit.get("a", start, stop)

    def test_keys_are_write_once(self, unit):
        unit.put("a", np.arange(3, dtype=np.int32))
        with pytest.raises(TransferQueueError, match="write-once"):
            unit.put("a", np.arange(4, dtype=np.int32))
        np.testing.assert_array_equal(unit.get("a"), np.arange(3))

    def test_object_and_zero_dim_arrays_are_refused(self, unit):
        with pytest.raises(ProtocolError):
            unit.put("o", np.array([{"x": 1}], dtype=object))
        with pytest.raises(RowRangeError):
            unit.put("z", np.float32(1.0))
        assert unit.list() == []

    def test_stored_bytes_do_not_change_when_the_source_does(self, unit):
        a = np.arange(8, dtype=np.float32)
        unit.put("a", a)
        a[:] = -1
        out = unit.get("a")
        np.testing.assert_array_equal(out, np.arange(8))
        assert not out.flags.writeable

    def test_non_contiguous_and_big_endian_input(self, unit):
        a = np.arange(40, dtype=np.int32).reshape(10, 4)[:, ::2]
        unit.put("nc", a)
        np.testing.assert_array_equal(unit.get("nc"), a)
        be = np.arange(5, dtype=">f4")
        unit.put("be", be)
        out = unit.get("be")
        assert out.dtype == np.dtype("float32") and out.dtype.isnative
        np.testing.assert_array_equal(out, be)

    def test_delete_exists_list_and_stats(self, unit):
        for i in range(3):
            unit.put(f"k{i}", np.zeros(4, dtype=np.int32))
        assert sorted(unit.list()) == ["k0", "k1", "k2"]
        assert unit.exists("k1") and not unit.exists("zz")
        s = unit.stats()
        assert (s["keys"], s["bytes"]) == (3, 48)
        assert unit.delete(["k1", "k1", "zz"]) == 1
        assert not unit.exists("k1")
        with pytest.raises(KeyNotFoundError):
            unit.get("k1")
        assert unit.delete(["k0", "k2"]) == 2
        s = unit.stats()
        assert (s["keys"], s["bytes"]) == (0, 0)

    def test_over_budget_put_spills_or_is_refused_leaving_nothing(self):
        unit = self.make_unit(1 * MiB)
        try:
            unit.put("small", np.zeros(MiB // 2, dtype=np.uint8))
            big = np.arange(MiB, dtype=np.uint8)
            if unit.supports_spill:
                info = unit.put("big", big)
                assert info.spilled
                np.testing.assert_array_equal(unit.get("big", 100, 200), big[100:200])
                s = unit.stats()
                assert s["spilled_bytes"] == MiB and s["memory_bytes"] == MiB // 2
            else:
                with pytest.raises(StorageFullError):
                    unit.put("big", big)
                assert not unit.exists("big")
                assert unit.stats()["bytes"] == MiB // 2
            unit.delete(["small"])
            unit.put("fits-now", np.zeros(MiB // 2, dtype=np.uint8))
        finally:
            unit.close()


    def test_put_many_is_all_or_nothing(self):
        unit = self.make_unit(1 * MiB)
        try:
            items = [("a", np.zeros(MiB // 2, dtype=np.uint8)), ("b", np.ones(MiB, dtype=np.uint8))]
            if unit.supports_spill:
                infos = unit.put_many(items)
                assert [i.key for i in infos] == ["a", "b"] and infos[1].spilled
            else:
                with pytest.raises(StorageFullError):
                    unit.put_many(items)
                assert unit.list() == [] and unit.stats()["bytes"] == 0
            with pytest.raises(TransferQueueError):
                unit.put_many([("c", np.zeros(2, dtype=np.uint8)), ("c", np.zeros(2, dtype=np.uint8))])
            assert not unit.exists("c")
        finally:
            unit.close()

    def test_deleted_buffers_are_reused_only_when_no_reader_holds_a_view(self):
        unit = self.make_unit(64 * MiB)
        try:
            unit.put("a", np.full(2 * MiB, 1, dtype=np.uint8))
            held = unit.get("a")
            unit.delete(["a"])
            unit.put("b", np.full(2 * MiB, 2, dtype=np.uint8))
            assert int(held[0]) == 1 and int(held[-1]) == 1  # the reader's view was not recycled
            np.testing.assert_array_equal(unit.get("b", 0, 4), [2, 2, 2, 2])
        finally:
            unit.close()


class TestMemoryStorageUnit(StorageUnitTests):
    def make_unit(self, memory_budget):
        return MemoryStorageUnit("mem", memory_budget=memory_budget)


class TestSpillStorageUnit(StorageUnitTests):
    @pytest.fixture(autouse=True)
    def _spill_root(self, tmp_path):
        self.root = tmp_path

    def make_unit(self, memory_budget):
        return SpillStorageUnit("spill", memory_budget=memory_budget, spill_dir=self.root)

    def test_spill_round_trip_and_cleanup(self):
        unit = self.make_unit(1000)
        arrays = {f"k{i}": np.full((50, 3), i, dtype=np.uint16) for i in range(6)}  # 300 B each
        for k, a in arrays.items():
            unit.put(k, a)
        s = unit.stats()
        assert s["memory_bytes"] <= 1000 and s["spilled_bytes"] > 0
        assert s["bytes"] == 6 * 300 and s["keys"] == 6
        for k, a in arrays.items():
            np.testing.assert_array_equal(unit.get(k), a)
            np.testing.assert_array_equal(unit.get(k, 7, 9), a[7:9])
        spilled_dir = unit.spill_dir
        assert any(n.endswith(".blob") for n in os.listdir(spilled_dir))
        unit.delete(list(arrays))
        assert unit.stats()["spilled_bytes"] == 0
        assert not any(n.endswith(".blob") for n in os.listdir(spilled_dir))
        unit.close()

    def test_failed_spill_write_is_storage_full_and_leaves_nothing(self, tmp_path):
        unit = SpillStorageUnit("s", memory_budget=10, spill_dir=tmp_path)
        shutil.rmtree(unit.spill_dir)  # the disk is gone
        with pytest.raises(StorageFullError):
            unit.put("k", np.zeros(100, dtype=np.uint8))
        assert not unit.exists("k") and unit.stats()["keys"] == 0
        unit.close()


class _Served:
    """A backend behind a StorageUnitServer thread, reached through a RemoteStorageUnit."""

    def __init__(self, backend):
        from dressage.tq.storage.remote import RemoteStorageUnit
        from dressage.tq.storage.server import StorageUnitServer

        self.backend = backend
        self.server = StorageUnitServer(backend).start()
        self.remote = RemoteStorageUnit.describe(backend.unit_id, self.server.address, timeout_s=5)
        self.remote.close = self.close  # closing the handle tears the server down too

    def close(self):
        type(self.remote).close(self.remote)
        self.server.stop()
        self.backend.close()


class TestRemoteStorageUnitOverMemory(StorageUnitTests):
    def make_unit(self, memory_budget):
        return _Served(MemoryStorageUnit("rmem", memory_budget=memory_budget)).remote

    def test_results_view_received_frames_and_are_read_only(self, unit):
        unit.put("k", np.arange(1 << 16, dtype=np.float32))
        out = unit.get("k", 10, 20)
        assert not out.flags.writeable and not out.flags.owndata


class TestRemoteStorageUnitOverSpill(StorageUnitTests):
    @pytest.fixture(autouse=True)
    def _spill_root(self, tmp_path):
        self.root = tmp_path

    def make_unit(self, memory_budget):
        remote = _Served(SpillStorageUnit("rspill", memory_budget=memory_budget, spill_dir=self.root)).remote
        assert remote.supports_spill and remote.remote
        return remote
