"""Our StorageUnit backends (memory, spill, and both over ZMQ) pass the public conformance suite,
``dressage.testing.StorageUnitTests``, plus the checks particular to each."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from dressage.errors import StorageFullError
from dressage.testing import StorageUnitTests, serve_unit
from dressage.tq.storage import MemoryStorageUnit, SpillStorageUnit


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


class TestRemoteStorageUnitOverMemory(StorageUnitTests):
    def make_unit(self, memory_budget):
        return serve_unit(MemoryStorageUnit("rmem", memory_budget=memory_budget))

    def test_results_view_received_frames_and_are_read_only(self, unit):
        unit.put("k", np.arange(1 << 16, dtype=np.float32))
        out = unit.get("k", 10, 20)
        assert not out.flags.writeable and not out.flags.owndata


class TestRemoteStorageUnitOverSpill(StorageUnitTests):
    @pytest.fixture(autouse=True)
    def _spill_root(self, tmp_path):
        self.root = tmp_path

    def make_unit(self, memory_budget):
        remote = serve_unit(SpillStorageUnit("rspill", memory_budget=memory_budget, spill_dir=self.root))
        assert remote.supports_spill and remote.remote
        return remote


def test_spilled_blobs_are_0600_in_a_0700_directory(tmp_path):
    import stat

    old = os.umask(0o022)
    try:
        unit = SpillStorageUnit("s0", memory_budget=0, spill_dir=tmp_path)
        unit.put("k", np.arange(64, dtype=np.float32))
    finally:
        os.umask(old)
    try:
        assert unit.info("k").spilled
        assert stat.S_IMODE(os.stat(unit.spill_dir).st_mode) == 0o700
        blobs = os.listdir(unit.spill_dir)
        assert blobs and all(stat.S_IMODE(os.stat(os.path.join(unit.spill_dir, b)).st_mode) == 0o600 for b in blobs)
        np.testing.assert_array_equal(unit.get("k"), np.arange(64, dtype=np.float32))
    finally:
        unit.close()
