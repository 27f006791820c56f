"""Same-host puts on the unit's stream socket, hashed by their writer: what the unit stores, and what it refuses."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from dressage.errors import IntegrityError, ProtocolError, StorageFullError, StorageUnitUnavailable
from dressage.tq.transport import shm
from dressage.tq.transport.bulk import StreamBroken
from dressage.tq.storage.integrity import checksum

pytestmark = pytest.mark.skipif(shm.host_id() is None, reason="no /dev/shm on this host")
SECRET = b"s" * 32
R3 = (4096, 40, 8)  # one step's routed experts: 1.25 MiB of uint8


def segments(token):
    """Segments in use (the free pool's ``-z`` files excluded)."""
    return [p for p in glob.glob(os.path.join(shm.SHM_DIR, f"dtq-{token}-*"))
            if not os.path.basename(p).startswith(f"dtq-{token}-z")]


def _r3(seed=0):
    return np.random.default_rng(seed).integers(0, 255, size=R3, dtype=np.uint8)


def _corrupt(token, key_segment_index=0):
    path = segments(token)[key_segment_index]
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, 1000)
        os.pwrite(fd, bytes([byte[0] ^ 0xFF]), 1000)
    finally:
        os.close(fd)


def test_a_segment_put_takes_the_stream_and_the_unit_keeps_its_writers_checksums(served):
    backend, server, remote = served
    a = _r3()
    zmq_before, stream_before = server.rpc.served, server.bulk.served
    remote.put("k", a)
    assert server.bulk.served == stream_before + 1 and server.rpc.served == zmq_before
    sums = backend._sums["k"]
    want = checksum(a)
    assert sums.block_rows == want.block_rows and list(sums.digests) == list(want.digests)
    assert not backend._unsealed  # nothing left for the unit to hash
    np.testing.assert_array_equal(remote.get("k"), a)
    _corrupt(server.shm.token)  # a byte of the segment changes after the put
    with pytest.raises(IntegrityError, match="'k'"):
        remote.get("k", 0, 100)
    np.testing.assert_array_equal(remote.get("k", 4000, 4096), a[4000:])  # the other blocks stay readable


def test_a_put_with_a_logprobs_frame_and_a_segment_reads_back_over_the_stream(served):
    _, server, remote = served
    lp = np.random.default_rng(1).standard_normal(4096).astype(np.float32)
    r3 = _r3(2)
    remote.put_many([("lp", lp), ("r3", r3)])
    out = remote.get_many([("lp", 0, None), ("r3", 10, 20)])
    np.testing.assert_array_equal(out[0], lp)
    np.testing.assert_array_equal(out[1], r3[10:20])


def test_digests_that_do_not_fit_the_shape_are_refused_and_nothing_is_stored(served):
    backend, server, remote = served
    a = _r3()
    good = checksum(a)
    bulk = remote._bulk_client(["x"])
    for i, sums in enumerate([[good.block_rows + 1, good.digests.astype("<u8").tobytes()],
                              [good.block_rows, good.digests[:-1].astype("<u8").tobytes()],
                              [good.block_rows, "not bytes"], [True, b""], "junk"]):
        name = f"dtq-{server.shm.token}-t{i}"
        shm.write_segment(name, a, server.shm.token)
        with pytest.raises(ProtocolError, match="checksums"):
            bulk.call("put", {"items": [[f"x{i}", "uint8", list(R3), name, sums]]}, keys=[f"x{i}"])
        shm.remove_segment(name)
        assert not backend.exists(f"x{i}")
    remote.put("fine", a)
    assert remote.exists("fine")


def test_wrong_digests_are_an_integrity_error_on_read_never_data(served):
    _, server, remote = served
    a = _r3()
    name = f"dtq-{server.shm.token}-w0"
    sums = shm.write_segment(name, a, server.shm.token, checksums=True)
    wrong = sums.digests.copy()
    wrong[2] ^= np.uint64(1)
    remote._bulk_client(["w"]).call("put", {"items": [["w", "uint8", list(R3), name,
                                                        [sums.block_rows, wrong.astype("<u8").tobytes()]]]})
    with pytest.raises(IntegrityError):
        remote.get("w")


def test_a_put_with_the_wrong_secret_is_refused_and_leaves_no_segment(served, intruder):
    backend, server, remote = served
    with pytest.raises(ProtocolError):
        intruder.put("evil", _r3())
    assert not backend.exists("evil") and segments(server.shm.token) == []
    assert remote.stats()["rejected_frames"] >= 1
    remote.put("fine", _r3())  # the unit keeps serving
    assert remote.exists("fine")


def test_a_full_unit_refuses_a_segment_put_and_keeps_nothing(served):
    backend, server, remote = served
    remote.put_many([(f"f{i}", _r3(i)) for i in range(6)])  # 7.5 of 8 MiB
    with pytest.raises(StorageFullError):
        remote.put("over", _r3(9))
    assert not backend.exists("over")
    assert len(segments(server.shm.token)) == 6  # the refused one went back to the free pool
    np.testing.assert_array_equal(remote.get("f5"), _r3(5))


def test_a_unit_that_dies_mid_put_stores_nothing_and_the_writer_removes_its_segment(served):
    backend, server, remote = served

    def dies(control, frames, tags=None):
        raise StreamBroken("the unit died")  # the connection closes with no reply

    server.bulk._handler = dies
    with pytest.raises(StorageUnitUnavailable, match="bulk"):
        remote.put("lost", _r3())
    assert not backend.exists("lost") and segments(server.shm.token) == []


@pytest.mark.parametrize("shape,dtype", [((4096, 40, 8), np.uint8), ((1000, 3), np.float64), ((70_000,), np.float32),
                                         ((5, 100_000), np.int16)])
def test_a_writers_checksums_are_the_units_own_block_rule(shape, dtype):
    a = np.random.default_rng(3).integers(0, 100, size=shape).astype(dtype)
    name = f"dtq-{shm.new_token()}-c0"
    try:
        sums = shm.write_segment(name, a, checksums=True)
        with open(os.path.join(shm.SHM_DIR, name), "rb") as f:
            assert f.read(a.nbytes) == a.tobytes()
    finally:
        shm.remove_segment(name)
    want = checksum(a)
    assert sums.block_rows == want.block_rows and list(sums.digests) == list(want.digests)
    assert shm.write_segment(name, a) is None
    shm.remove_segment(name)
