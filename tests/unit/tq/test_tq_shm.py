"""Same-host shared-memory path: segments are adopted without copies, read by mapping, and cleaned up."""

from __future__ import annotations

import gc
import glob
import mmap
import os

import numpy as np
import pytest

from dressage.errors import KeyNotFoundError, ProtocolError
from dressage.tq import TransferQueue, TransferQueueClient
from dressage.tq.transport import shm
from dressage.tq.transport import shm_pool
from dressage.tq.transport import wire
from dressage.tq.storage import MemoryStorageUnit, SpillStorageUnit
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.storage.server import StorageUnitServer

pytestmark = pytest.mark.skipif(shm.host_id() is None, reason="no /dev/shm on this host")
BIG = 1 << 20


def every_file(token):
    return glob.glob(os.path.join(shm.SHM_DIR, f"dtq-{token}-*"))


def segments(token):
    """Segments in use (the free pool's ``-z`` files excluded)."""
    return [p for p in every_file(token) if not os.path.basename(p).startswith(f"dtq-{token}-z")]


def _backing(array):
    obj = array
    while isinstance(obj, np.ndarray):
        obj = obj.base
    return obj.obj if isinstance(obj, memoryview) else obj


@pytest.fixture
def served(tmp_path):
    backend = SpillStorageUnit("s0", memory_budget=3 * BIG, spill_dir=tmp_path)
    server = StorageUnitServer(backend).start()
    remote = RemoteStorageUnit.describe("s0", server.address, timeout_s=5)
    yield backend, server, remote
    remote.close()
    server.stop()
    backend.close()


def test_large_put_goes_through_a_segment_and_get_maps_it(served):
    backend, server, remote = served
    assert remote.uses_shared_memory
    a = np.arange(BIG // 4, dtype=np.float32)
    remote.put("k", a)
    assert len(segments(server.shm.token)) == 1
    assert remote.stats()["shm_bytes"] == a.nbytes
    out = remote.get("k", 1000, 2000)
    np.testing.assert_array_equal(out, a[1000:2000])
    assert isinstance(_backing(out), mmap.mmap) and not out.flags.writeable
    small = np.arange(10, dtype=np.int32)  # below the threshold: a socket frame
    remote.put("small", small)
    assert len(segments(server.shm.token)) == 1
    np.testing.assert_array_equal(remote.get("small"), small)


def test_segment_is_unlinked_on_delete_and_a_held_view_stays_valid(served):
    _, server, remote = served
    a = np.full(BIG, 7, dtype=np.uint8)
    remote.put("k", a)
    held = remote.get("k")
    remote.delete(["k"])
    gc.collect()
    # A reader's view holds the segment: it is unlinked, never recycled under that view (the pool's
    # one-page index is all that is left of this unit's files).
    assert [os.path.basename(p) for p in every_file(server.shm.token)] == [shm_pool.index_name(server.shm.token)]
    assert int(held[0]) == 7 and int(held[-1]) == 7
    with pytest.raises(KeyNotFoundError):
        remote.get("k")


def test_spilled_put_leaves_no_segment_and_reads_over_the_socket(served):
    backend, server, remote = served
    blobs = [np.full(BIG, i, dtype=np.uint8) for i in range(5)]  # 5 MiB into a 3 MiB budget
    for i, b in enumerate(blobs):
        remote.put(f"k{i}", b)
    gc.collect()
    s = remote.stats()
    assert s["spilled_bytes"] == 2 * BIG and len(segments(server.shm.token)) == 3
    for i, b in enumerate(blobs):
        np.testing.assert_array_equal(remote.get(f"k{i}", 5, 9), b[5:9])


def test_foreign_segment_names_are_refused_and_the_unit_keeps_serving(served, tmp_path):
    _, server, remote = served
    import zmq

    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(server.address)
    try:
        for name in ["../../etc/passwd", "dtq-0000000000000000-1", f"dtq-{server.shm.token}-nope"]:
            raw.send_multipart(wire.encode({"op": "put", "items": [["evil", "uint8", [4], name]]}))
            assert raw.poll(5000)
            reply = wire.decode_control(raw.recv_multipart()[0])
            assert reply["error"] == "ProtocolError"
    finally:
        raw.close(0)
    assert not remote.exists("evil")
    remote.put("fine", np.zeros(BIG, dtype=np.uint8))
    assert remote.exists("fine")
    with pytest.raises(ProtocolError):
        shm.map_segment("../x", 0, np.dtype("uint8"), (1,))


def test_shared_memory_can_be_turned_off():
    backend = MemoryStorageUnit("m0", memory_budget=4 * BIG)
    server = StorageUnitServer(backend, shared_memory=False).start()
    remote = RemoteStorageUnit.describe("m0", server.address, timeout_s=5)
    try:
        assert not remote.uses_shared_memory
        remote.put("k", np.ones(BIG, dtype=np.uint8))
        assert not isinstance(_backing(remote.get("k")), mmap.mmap)
    finally:
        remote.close()
        server.stop()
        backend.close()


def test_embedded_deployment_exposed_to_a_same_host_client_uses_segments_and_cleans_up():
    with TransferQueue.start({"unit_memory_budget": "16MiB"}) as tq:
        spec = tq.client_spec()
        tokens = [u["shm_token"] for u in spec["units"]]
        client = TransferQueueClient.connect(spec)
        ref = client.put("routed_experts", np.ones((BIG // 32, 8, 4), dtype=np.uint8), batch="b")
        assert len(segments(tokens[0])) == 1
        assert int(client.get(ref.narrow(3, 4)).sum()) == 32
        client.close()
    assert all(every_file(t) == [] for t in tokens)


def test_released_segment_is_recycled_for_the_next_put_of_its_class(served):
    _, server, remote = served
    token = server.shm.token
    a = np.full(BIG, 3, dtype=np.uint8)
    remote.put("a", a)
    first = os.stat(segments(token)[0]).st_ino
    remote.delete(["a"])
    gc.collect()
    assert segments(token) == [] and len(shm.free_segments(token)) == 1
    assert remote.stats()["shm_free_segments"] == 1
    b = np.arange(BIG - 4096, dtype=np.uint8)  # same class (1 MiB), fewer bytes
    remote.put("b", b)
    (path,) = segments(token)
    assert os.stat(path).st_ino == first and shm.free_segments(token) == []  # the same file, handed out again
    np.testing.assert_array_equal(remote.get("b"), b)
    c = np.full(2 * BIG, 9, dtype=np.uint8)  # another class: a new file
    remote.put("c", c)
    assert len({os.stat(p).st_ino for p in segments(token)}) == 2
    np.testing.assert_array_equal(remote.get("c"), c)


def test_free_pool_is_bounded_and_a_claimed_segment_is_never_shown_to_an_old_reader(tmp_path):
    backend = MemoryStorageUnit("m0", memory_budget=16 * BIG)
    server = StorageUnitServer(backend).start()
    server.shm.pool_bytes = BIG  # room for one free 1 MiB segment
    remote = RemoteStorageUnit.describe("m0", server.address, timeout_s=5)
    token = server.shm.token
    try:
        for i in range(3):
            remote.put(f"k{i}", np.full(BIG, i, dtype=np.uint8))
        remote.delete([f"k{i}" for i in range(3)])
        gc.collect()
        assert len(shm.free_segments(token)) == 1 and segments(token) == []  # two were unlinked
        remote.put("x", np.full(BIG, 5, dtype=np.uint8))
        (name,) = [os.path.basename(p) for p in segments(token)]
        remote.delete(["x"])
        gc.collect()
        # The unit released "x" into the pool: its old name no longer maps, so no stale bytes are shown.
        with pytest.raises(KeyNotFoundError):
            shm.map_segment(name, 0, np.dtype("uint8"), (BIG,))
    finally:
        remote.close()
        server.stop()
        backend.close()
    assert every_file(token) == []


def test_a_segment_whose_size_is_not_its_class_is_refused(served):
    _, server, remote = served
    token = server.shm.token
    name = f"dtq-{token}-bad1"
    with open(os.path.join(shm.SHM_DIR, name), "wb") as f:
        f.write(b"\0" * BIG)
    import zmq

    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(server.address)
    try:
        raw.send_multipart(wire.encode({"op": "put", "items": [["k", "uint8", [BIG // 2], name]]}))
        assert raw.poll(5000)
        assert wire.decode_control(raw.recv_multipart()[0])["error"] == "ProtocolError"
    finally:
        raw.close(0)
    assert not remote.exists("k") and segments(token) == [] and shm.free_segments(token) == []


# --- the free pool's index and the writer's kept mappings -------------------------------------


def _free_file(directory, name, size):
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_claim_and_release_never_list_the_directory(tmp_path, monkeypatch):
    pool = shm_pool.create_pool(str(tmp_path), "ab" * 8)
    try:
        seg = _free_file(tmp_path, "seg", 1 << 20)

        def no_listing(*a, **k):
            raise AssertionError("the directory was listed")

        for name in ("listdir", "scandir"):
            monkeypatch.setattr(os, name, no_listing)
        monkeypatch.setattr(glob, "glob", no_listing)
        assert pool.release(seg, 1 << 20, 1 << 30)
        assert pool.names() == [shm_pool.slot_name("ab" * 8, 20, 0)] and pool.free_bytes() == 1 << 20
        assert not pool.claim(2 << 20, str(tmp_path / "other-class"))
        assert pool.claim(1 << 20, str(tmp_path / "mine"))
        assert (tmp_path / "mine").stat().st_size == 1 << 20 and pool.names() == [] and pool.free_bytes() == 0
    finally:
        shm_pool.drop_pool(str(tmp_path), "ab" * 8)


def test_pool_is_bounded_by_bytes_and_by_slots_per_class(tmp_path):
    token = "cd" * 8
    pool = shm_pool.create_pool(str(tmp_path), token)
    try:
        page = 4096
        kept = [pool.release(_free_file(tmp_path, f"s{i}", page), page, 1 << 30) for i in range(shm_pool.SLOTS + 2)]
        assert kept == [True] * shm_pool.SLOTS + [False, False]  # the caller unlinks the two left over
        assert pool.free_bytes() == shm_pool.SLOTS * page
        assert not pool.release(_free_file(tmp_path, "big", 1 << 20), 1 << 20, shm_pool.SLOTS * page + 4096)
    finally:
        shm_pool.drop_pool(str(tmp_path), token)


def test_a_bit_without_its_file_is_skipped_and_cleared(tmp_path):
    token = "ef" * 8
    pool = shm_pool.create_pool(str(tmp_path), token)
    try:
        for i in range(2):
            assert pool.release(_free_file(tmp_path, f"s{i}", 1 << 20), 1 << 20, 1 << 30)
        os.unlink(tmp_path / shm_pool.slot_name(token, 20, 0))  # as a claimer that died mid-claim leaves it
        assert pool.claim(1 << 20, str(tmp_path / "got"))
        assert pool.names() == [] and not pool.claim(1 << 20, str(tmp_path / "none"))
    finally:
        shm_pool.drop_pool(str(tmp_path), token)


def test_two_processes_views_of_one_index_never_hand_out_a_segment_twice(tmp_path):
    import threading

    token = "0a" * 8
    unit = shm_pool.create_pool(str(tmp_path), token)
    fd = os.open(tmp_path / shm_pool.index_name(token), os.O_RDWR)
    other = shm_pool.FreePool(str(tmp_path), token, fd)  # a second descriptor: what another process holds
    try:
        n = 100
        for i in range(n):
            assert unit.release(_free_file(tmp_path, f"s{i}", 1 << 16), 1 << 16, 1 << 30)
        got: list[str] = []

        def claim(pool, tag):
            for i in range(n):
                dest = str(tmp_path / f"{tag}{i}")
                if pool.claim(1 << 16, dest):
                    got.append(dest)

        threads = [threading.Thread(target=claim, args=(p, t)) for p, t in ((unit, "a"), (other, "b"), (other, "c"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == n and all(os.path.exists(p) for p in got) and unit.names() == []
    finally:
        other.close()
        shm_pool.drop_pool(str(tmp_path), token)


def test_index_is_reopened_when_its_unit_made_a_new_one(tmp_path):
    token = "1b" * 8
    first = shm_pool.create_pool(str(tmp_path), token)
    assert shm_pool.pool_for(str(tmp_path), token) is first
    shm_pool.drop_pool(str(tmp_path), token)
    os.unlink(tmp_path / shm_pool.index_name(token))
    assert shm_pool.pool_for(str(tmp_path), token) is None  # no unit: nothing to claim from
    second = shm_pool.create_pool(str(tmp_path), token)
    shm_pool.drop_pool(str(tmp_path), token)  # forget it here, as another process never had it
    again = shm_pool.pool_for(str(tmp_path), token)
    assert again is not None and again.inode == second.inode
    shm_pool.drop_pool(str(tmp_path), token)


def test_recycled_segments_stay_correct_through_many_rounds_and_leave_nothing(served):
    _, server, remote = served
    token = server.shm.token
    for r in range(4):
        arrays = [np.full(BIG - 4096 * i, r * 10 + i, dtype=np.uint8) for i in range(2)]
        for i, a in enumerate(arrays):
            remote.put(f"r{r}-{i}", a)
        for i, a in enumerate(arrays):
            np.testing.assert_array_equal(remote.get(f"r{r}-{i}"), a)
        remote.delete([f"r{r}-{i}" for i in range(2)])
        gc.collect()
    assert segments(token) == [] and len(shm.free_segments(token)) == 2


def test_puts_and_releases_through_a_unit_never_list_dev_shm(served, monkeypatch):
    _, server, remote = served
    remote.put("warm", np.ones(BIG, dtype=np.uint8))  # connections and the index are open from here on

    def no_listing(*a, **k):
        raise AssertionError("/dev/shm was listed")

    for name in ("listdir", "scandir"):
        monkeypatch.setattr(os, name, no_listing)
    monkeypatch.setattr(glob, "glob", no_listing)
    for i in range(3):
        remote.put(f"k{i}", np.full(BIG, i, dtype=np.uint8))
        remote.delete([f"k{i}"] if i else ["warm", "k0"])
        gc.collect()
    monkeypatch.undo()
    assert segments(server.shm.token) == [] and len(shm.free_segments(server.shm.token)) == 2


def test_a_spilling_put_frees_its_segment_and_the_free_pool_counts_against_the_budget(served):
    """A same-host put that spills leaves no segment behind: the free pool keeps a freed segment only
    while the budget has room for it, and what it keeps is counted as held."""
    backend, server, remote = served  # a 3 MiB budget
    token = server.shm.token
    remote.put("kept", np.full(2 * BIG, 1, dtype=np.uint8))  # in memory, through a segment
    remote.put("spilled", np.full(4 * BIG, 2, dtype=np.uint8))  # does not fit: spilled to disk
    gc.collect()
    s = remote.stats()
    assert s["spilled_bytes"] == 4 * BIG and s["memory_bytes"] == 2 * BIG
    # The spilled put's 4 MiB segment was unlinked: 1 MiB of budget was left, so the pool took none.
    assert len(segments(token)) == 1 and s["shm_free_segments"] == 0 and s["shm_free_bytes"] == 0
    assert s["held_bytes"] <= backend.memory_budget
    np.testing.assert_array_equal(remote.get("spilled", 0, 3), [2, 2, 2])
    remote.delete(["kept"])
    gc.collect()
    s = remote.stats()
    # With the budget free again the pool recycles the freed 2 MiB segment, counted as held.
    assert s["shm_free_segments"] == 1 and s["shm_free_bytes"] == 2 * BIG == s["held_bytes"]
