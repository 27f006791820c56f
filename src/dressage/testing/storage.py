"""``StorageUnitTests``: the conformance suite of a StorageUnit backend.

Subclass it in a pytest module, define ``make_unit(memory_budget)``, and every behaviour the clients rely
on is checked: dtype/shape/values round trips, row ranges, typed errors for bad keys and ranges,
write-once keys, all-or-nothing ``put_many``, budget enforcement (spill or StorageFullError, nothing
half-written), delete/exists/list/stats bookkeeping and buffer reuse safety::

    from dressage.testing import StorageUnitTests

    class TestMyBackend(StorageUnitTests):
        def make_unit(self, memory_budget):
            return MyStorageUnit("u0", memory_budget=memory_budget)

A backend implements :class:`dressage.tq.storage.StorageUnit` (``_write``, ``_read``, ``_info``,
``delete``, ``exists``, ``list``, ``usage``, ``close``); ``supports_spill`` decides which branch of the
budget tests applies. :func:`serve_unit` puts a backend behind a ZMQ StorageUnitServer so the same suite
runs over the wire.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dressage.errors import KeyNotFoundError, ProtocolError, RowRangeError, StorageFullError, TransferQueueError
from dressage.tq.storage import StorageUnit

__all__ = ["StorageUnitTests", "serve_unit"]

MiB = 1 << 20


class StorageUnitTests:
    """Behaviour every backend must have. Subclasses provide ``make_unit(memory_budget)``: a new, empty
    unit with that byte budget, which the test closes."""

    def make_unit(self, memory_budget: int) -> StorageUnit:
        raise NotImplementedError(f"{type(self).__name__} must define make_unit(memory_budget)")

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


def serve_unit(backend: StorageUnit, **server_options: Any) -> StorageUnit:
    """``backend`` behind a StorageUnitServer thread, reached through a RemoteStorageUnit. Closing the
    returned handle stops the server and closes the backend too."""
    from dressage.tq.storage.remote import RemoteStorageUnit
    from dressage.tq.storage.server import StorageUnitServer

    server = StorageUnitServer(backend, **server_options).start()
    try:
        remote = RemoteStorageUnit.describe(backend.unit_id, server.address, timeout_s=5,
                                            secret=server_options.get("secret"))
    except BaseException:
        server.stop()
        raise

    def close() -> None:
        RemoteStorageUnit.close(remote)
        server.stop()
        backend.close()

    remote.close = close  # type: ignore[method-assign]
    return remote
