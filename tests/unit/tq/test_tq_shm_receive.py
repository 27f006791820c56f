"""A put that arrives over the unit's bulk stream (a writer on another host) lands in a segment of the
unit, so readers on the unit's host map it instead of receiving it again over a socket."""

from __future__ import annotations

import gc
import glob
import mmap
import os

import numpy as np
import pytest

from dressage.tq.transport import landing, shm
from dressage.tq.storage import MemoryStorageUnit
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.storage.server import StorageUnitServer
from test_tq_bulk import SECRET, _put_message, _send_raw, _wait_for

pytestmark = pytest.mark.skipif(shm.host_id() is None, reason="no /dev/shm on this host")
MiB = 1 << 20


def _in_use(token):
    return [p for p in glob.glob(os.path.join(shm.SHM_DIR, f"dtq-{token}-*"))
            if not os.path.basename(p).startswith(f"dtq-{token}-z")]


def _backing(array):
    obj = array
    while isinstance(obj, np.ndarray):
        obj = obj.base
    return obj.obj if isinstance(obj, memoryview) else obj


@pytest.fixture(params=[None, SECRET], ids=["open", "mac"])
def hosts(request, monkeypatch):
    backend = MemoryStorageUnit("h0", memory_budget=64 * MiB)
    server = StorageUnitServer(backend, secret=request.param).start()
    reader = RemoteStorageUnit.describe("h0", server.address, timeout_s=10, secret=request.param)
    with monkeypatch.context() as m:  # a client on another host: its host identity differs
        m.setattr(shm, "host_id", lambda: "another-host")
        writer = RemoteStorageUnit.describe("h0", server.address, timeout_s=10, secret=request.param)
    yield backend, server, writer, reader, request.param
    writer.close()
    reader.close()
    server.stop()
    backend.close()


def test_a_streamed_put_lands_in_a_segment_that_local_readers_map(hosts):
    backend, server, writer, reader, _ = hosts
    assert reader.uses_shared_memory and not writer.uses_shared_memory
    a = np.random.default_rng(1).integers(0, 256, size=(2048, 40, 8), dtype=np.uint8)  # 640 KiB of R3
    writer.put("r3", a)
    assert server.shm.stats()["shm_segments"] == 1 and len(_in_use(server.shm.token)) == 1
    stored = backend.get("r3")  # received past the segment's first page boundary, where copies in run fastest
    assert stored.ctypes.data % landing.PAGE == landing.OFFSET and server.shm.locate(stored)[1] == landing.OFFSET
    del stored
    local = reader.get("r3", 100, 900)
    np.testing.assert_array_equal(local, a[100:900])
    assert isinstance(_backing(local), mmap.mmap) and not local.flags.writeable
    remote = writer.get("r3")  # the other host reads it back over the socket
    np.testing.assert_array_equal(remote, a)
    assert not isinstance(_backing(remote), mmap.mmap)
    del local, remote
    assert writer.delete(["r3"]) == 1
    gc.collect()
    assert _in_use(server.shm.token) == [] and len(shm.free_segments(server.shm.token)) == 1
    writer.put("again", a[::-1].copy())  # the freed segment is received into again
    assert shm.free_segments(server.shm.token) == []
    np.testing.assert_array_equal(reader.get("again"), a[::-1])


def test_small_streamed_puts_and_a_full_dev_shm_stay_in_the_units_memory(hosts, monkeypatch):
    backend, server, writer, reader, _ = hosts
    small = np.arange(shm.SHM_MIN_BYTES // 8 - 1, dtype=np.float64)  # bulk-sized, below the segment floor
    writer.put("small", small)
    assert server.shm.stats()["shm_segments"] == 0

    def no_room(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_room)
    big = np.arange(MiB // 4, dtype=np.float32)
    writer.put("big", big)
    assert server.shm.stats()["shm_segments"] == 0 and _in_use(server.shm.token) == []
    np.testing.assert_array_equal(reader.get("big"), big)
    np.testing.assert_array_equal(reader.get("small"), small)


def test_a_rejected_or_cut_streamed_put_leaves_no_segment(hosts):
    backend, server, writer, reader, secret = hosts
    a = np.random.default_rng(2).standard_normal(MiB // 8)
    message = bytearray(_put_message("k", a, secret))
    if secret is None:  # the stream ends halfway through the payload
        _send_raw(server, bytes(message)[: len(message) // 2], close=True)
        _wait_for(lambda: server.bulk.broken == 1, "the unit did not drop the cut stream")
    else:  # one payload bit flipped: the MAC does not match
        message[len(message) // 2] ^= 1
        reply = _send_raw(server, bytes(message))
        assert reply["ok"] is False and "MAC" in reply["message"]
    gc.collect()
    assert backend.list() == [] and _in_use(server.shm.token) == []
    writer.put("after", a)
    np.testing.assert_array_equal(reader.get("after"), a)
