"""The bulk stream: payloads received in place into recycled buffers, authenticated, all or nothing."""

from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np
import pytest

from dressage.errors import ProtocolError, StorageUnitUnavailable
from dressage.tq.transport import bulk, landing
from dressage.tq.transport import wire
from dressage.tq.transport.bulk_rpc import BulkClient
from dressage.tq.storage import MemoryStorageUnit
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.storage.server import StorageUnitServer

SECRET = b"bulk-test-secret-0123456789"
MiB = 1 << 20


@pytest.fixture(params=[None, SECRET], ids=["open", "mac"])
def unit(request):
    backend = MemoryStorageUnit("b0", memory_budget=256 * MiB)
    server = StorageUnitServer(backend, shared_memory=False, secret=request.param).start()
    remote = RemoteStorageUnit.describe("b0", server.address, timeout_s=10, secret=request.param)
    yield backend, server, remote, request.param
    remote.close()
    server.stop()
    backend.close()


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _payload(seed: int, nbytes: int = 2 * MiB) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(nbytes // 8).reshape(-1, 256)


class _Capture:
    """Stands in for a Conn: collects what ``write_message`` sends, tagging it the way Conn does."""

    def __init__(self) -> None:
        self.data = bytearray()

    def send(self, mv, mac=None) -> None:
        if mac is not None:
            mac.update(mv)
        self.data += bytes(mv)


def _put_message(key: str, array: np.ndarray, secret, seq: int = 1, nonce: bytes = b"n" * 16) -> bytes:
    out = _Capture()
    frame = wire.encode({"op": "put", "id": 1, "items": [[key, wire.dtype_name(array.dtype), list(array.shape)]]})[0]
    bulk.write_message(out, frame, [array], secret=secret, nonce=nonce, seq=seq)
    return bytes(out.data)


def _send_raw(server: StorageUnitServer, data: bytes, *, close: bool = False):
    """Send raw bytes to the unit's bulk port; the decoded reply, or None when ``close``."""
    sock = socket.create_connection(("127.0.0.1", server.bulk.port), timeout=5)
    try:
        sock.sendall(data)
        if close:
            return None
        conn = bulk.Conn(sock, lambda quiet: None)
        sock.settimeout(5)
        control = bulk.read_message(conn, secret=server.bulk._secret, alloc=bulk.RecvPool().take,
                                          max_bytes=1 << 30).control
        return wire.decode_control(control)
    finally:
        sock.close()


def _send_refused(server: StorageUnitServer, data: bytes):
    """``_send_raw`` of a message the unit refuses from its head: the reply, or None when the unit closed
    the connection before the whole message was sent."""
    try:
        return _send_raw(server, data)
    except (ConnectionResetError, BrokenPipeError):
        return None


def _wait_for(check, what: str) -> None:
    deadline = time.monotonic() + 5
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_large_puts_and_gets_take_the_stream_and_keep_values_dtype_and_shape(unit):
    backend, server, remote, _ = unit
    a, small = _payload(1), np.arange(10, dtype=np.int16)
    remote.put_many([("big", a), ("small", small)])
    got_a, got_small = remote.get_many([("big", 0, None), ("small", 2, 5)])
    np.testing.assert_array_equal(got_a, a)
    np.testing.assert_array_equal(got_small, [2, 3, 4])
    assert got_a.dtype == a.dtype and got_a.shape == a.shape and not got_a.flags.writeable
    assert server.bulk.served == 2  # the put and the get; nothing large went over ZMQ
    # The unit stored the buffer it received into, not a copy of it.
    stored = backend._blobs["big"]
    assert isinstance(stored.base, np.ndarray) and stored.base.dtype == np.uint8 and stored.base.flags.owndata
    remote.put("tiny", np.ones(4))  # a small put stays on ZMQ
    assert server.bulk.served == 2


def test_a_handle_built_from_a_spec_asks_the_unit_for_its_bulk_port_once(unit):
    backend, server, _, secret = unit
    handle = RemoteStorageUnit("b0", server.address, timeout_s=10, secret=secret)  # as connect_spec builds it
    assert handle._bulk is False
    handle.put("k", _payload(1))
    assert isinstance(handle._bulk, BulkClient) and handle._bulk.port == server.bulk.port
    np.testing.assert_array_equal(handle.get("k"), _payload(1))
    assert server.bulk.served == 2
    handle.close()


def test_the_unit_receives_a_put_into_the_buffer_a_deleted_blob_left(unit):
    backend, _, remote, _ = unit
    remote.put("k1", _payload(1))
    first = _address(backend._blobs["k1"])
    remote.delete(["k1"])
    remote.put("k2", _payload(2))
    assert _address(backend._blobs["k2"]) == first
    np.testing.assert_array_equal(remote.get("k2"), _payload(2))


def test_client_buffers_are_reused_only_once_no_result_views_them(unit):
    _, _, remote, _ = unit
    for i in range(3):
        remote.put(f"k{i}", _payload(i))
    held = remote.get("k0")
    row = held[3:4]  # a view of a view still pins the buffer
    addr = _address(held)
    del held
    second = remote.get("k1")
    assert _address(second) != addr and not np.shares_memory(second, row)
    np.testing.assert_array_equal(row, _payload(0)[3:4])
    np.testing.assert_array_equal(second, _payload(1))
    del row, second
    third = remote.get("k2")
    assert _address(third) == addr  # the freed buffer came back
    np.testing.assert_array_equal(third, _payload(2))
    assert remote._bulk.pool.reused >= 1


def test_concurrent_gets_never_see_each_others_bytes(unit):
    _, _, remote, _ = unit
    keys = [f"k{i}" for i in range(6)]
    remote.put_many([(k, _payload(i, MiB + 2048 * i)) for i, k in enumerate(keys)])
    results: list = []
    errors: list = []

    def reader(n: int) -> None:
        try:
            for r in range(5):
                i = (n + r) % len(keys)
                results.append((i, remote.get(keys[i])))  # every result is held to the end
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 20
    for i, got in results:
        np.testing.assert_array_equal(got, _payload(i, MiB + 2048 * i))


def test_recv_pool_size_classes_cap_and_idle_trim():
    pool = bulk.RecvPool(cap_bytes=4 * MiB, idle_s=0.0)
    assert pool.size_class(MiB) == MiB and pool.size_class(MiB + 1) == MiB + MiB // 8
    assert pool.size_class(3 * MiB) == 3 * MiB
    a = pool.take(3 * MiB)
    b = pool.take(3 * MiB)  # over the cap: an unpooled buffer
    assert pool.pooled_bytes == 3 * MiB and b.nbytes == 3 * MiB
    assert pool.take(100).nbytes == 100  # small: never pooled
    del a
    pool.take(MiB)  # the idle 3 MiB buffer is trimmed
    assert pool.pooled_bytes == MiB


def test_recv_pool_drop_idle_gives_back_every_unviewed_buffer_and_keeps_the_viewed():
    pool = bulk.RecvPool(cap_bytes=64 * MiB, idle_s=3600.0)
    held, idle = pool.take(2 * MiB), pool.take(3 * MiB)
    del idle
    assert pool.pooled_bytes == 5 * MiB
    assert pool.drop_idle() == 3 * MiB and pool.pooled_bytes == 2 * MiB
    del held
    assert pool.drop_idle() == 2 * MiB and pool.pooled_bytes == 0
    assert pool.take(2 * MiB).ctypes.data % landing.PAGE == landing.OFFSET and pool.reused == 0


def test_recv_pool_finds_each_next_free_buffer_first_while_a_read_holds_the_ones_it_took(monkeypatch):
    """A read of 64 payloads into a pool of 64 free buffers reuses every one of them, and looks at about one
    buffer per take to find it (taken buffers move behind the free ones), not at every buffer it holds."""
    pool = bulk.RecvPool(cap_bytes=256 * MiB, idle_s=3600.0)
    first = [pool.take(MiB + 4096) for _ in range(64)]
    owners = {id(landing.owner_of(b)) for b in first}
    del first
    looked = []
    free = pool._free
    monkeypatch.setattr(pool, "_free", lambda entry: looked.append(1) or free(entry))
    held = [pool.take(MiB + 4096) for _ in range(64)]
    assert {id(landing.owner_of(b)) for b in held} == owners and pool.reused == 64
    assert len(looked) == 64
    held.append(pool.take(MiB + 4096))  # every pooled one held: a new buffer, after a look at the first few
    assert len(looked) == 64 + bulk._SCAN and pool.reused == 64


def test_recv_pool_buffers_land_past_a_page_boundary_and_are_reused_only_once_unviewed():
    """Every pooled buffer starts ``landing.OFFSET`` bytes into a page (where the kernel copies a socket's
    bytes in fastest here), the unpooled ones past the cap too; a buffer comes back only when no view of
    it is left."""
    pool = bulk.RecvPool(cap_bytes=8 * MiB)
    first = pool.take(2 * MiB + 7)
    over = [pool.take(5 * MiB), pool.take(5 * MiB)]  # the second is past the cap
    for buf in (first, *over):
        assert buf.ctypes.data % landing.PAGE == landing.OFFSET and buf.flags.writeable
    start = first.ctypes.data
    view = first[8:16].view(np.int32)
    del first
    again = pool.take(2 * MiB + 7)
    assert again.ctypes.data != start  # a view still reads the first one
    del again, view
    assert pool.take(2 * MiB + 7).ctypes.data == start and pool.reused == 1


def test_a_truncated_put_stores_nothing_and_the_unit_keeps_serving(unit):
    backend, server, remote, secret = unit
    message = _put_message("cut", _payload(3), secret)
    _send_raw(server, message[: len(message) // 2], close=True)
    _wait_for(lambda: server.bulk.broken == 1, "the unit did not drop the truncated stream")
    assert backend.list() == [] and backend.usage()["bytes"] == 0
    remote.put("after", _payload(4))
    np.testing.assert_array_equal(remote.get("after"), _payload(4))


def test_a_stalled_put_is_dropped_after_stall_s_and_stores_nothing():
    backend = MemoryStorageUnit("s0", memory_budget=64 * MiB)
    server = StorageUnitServer(backend, shared_memory=False).start()
    server.bulk.stall_s = 0.3
    sock = socket.create_connection(("127.0.0.1", server.bulk.port), timeout=5)
    try:
        message = _put_message("slow", _payload(5), None)
        sock.sendall(message[:-1000])  # then silence
        _wait_for(lambda: server.bulk.broken == 1, "the unit kept waiting on a stalled stream")
        assert backend.list() == []
    finally:
        sock.close()
        server.stop()


def test_a_truncated_reply_is_storage_unit_unavailable_at_the_client():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def fake_unit() -> None:
        conn, _ = listener.accept()
        conn.recv(1 << 16)
        reply = _Capture()
        frame = wire.encode({"ok": True, "id": 1, "arrays": [["uint8", [4 * MiB]]]})[0]
        bulk.write_message(reply, frame, [np.zeros(4 * MiB, np.uint8)], secret=None)
        conn.sendall(bytes(reply.data[: MiB]))
        conn.close()

    t = threading.Thread(target=fake_unit)
    t.start()
    client = BulkClient("127.0.0.1", port, timeout_s=5, name="StorageUnit f0")
    with pytest.raises(StorageUnitUnavailable, match="closed after"):
        client.call("get", {"reqs": [["k", 0, None]]}, keys=["k"])
    t.join()
    client.close()
    listener.close()


def test_a_silent_unit_is_unavailable_as_soon_as_it_is_marked_dead():
    listener = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    client = BulkClient("127.0.0.1", listener.getsockname()[1], timeout_s=60, name="StorageUnit d0")
    calls = iter([None, None])
    client.set_abort(lambda: next(calls, "marked dead by the Controller"))
    with pytest.raises(StorageUnitUnavailable, match="marked dead"):
        client.call("get", {"reqs": []}, keys=["k"])
    client.close()
    listener.close()


def test_a_tampered_or_replayed_put_is_rejected_and_stores_nothing():
    backend = MemoryStorageUnit("m0", memory_budget=64 * MiB)
    server = StorageUnitServer(backend, shared_memory=False, secret=SECRET).start()
    try:
        a = _payload(6)
        message = bytearray(_put_message("k", a, SECRET, seq=1))
        message[len(message) // 2] ^= 1  # one payload bit
        reply = _send_raw(server, bytes(message))
        assert reply["ok"] is False and reply["error"] == "ProtocolError" and "MAC" in reply["message"]
        # A wrong secret and a replay are refused from the message's head, before its 2 MiB payload is
        # read: the refusal comes back, or the unit's close cuts the send short.
        wrong = _send_refused(server, _put_message("k", a, b"another-secret-of-16+", seq=2))
        assert wrong is None or (wrong["ok"] is False and "MAC" in wrong["message"])
        assert backend.list() == []
        good = _put_message("k", a, SECRET, seq=3)
        assert _send_raw(server, good)["ok"] is True
        replayed = _send_refused(server, good)
        assert replayed is None or (replayed["ok"] is False and "replay" in replayed["message"])
        _wait_for(lambda: server.bulk.rejected == 3, "the bit, the secret and the replay refused")
        assert backend.list() == ["k"]
        unsigned = BulkClient("127.0.0.1", server.bulk.port, timeout_s=5, name="StorageUnit m0")  # no secret
        meta = [["x", wire.dtype_name(a.dtype), list(a.shape)]]
        # Refused as unauthenticated, or cut off mid-send when the unit drops the unreadable stream.
        with pytest.raises((ProtocolError, StorageUnitUnavailable)):
            unsigned.call("put", {"items": meta}, [a], keys=["x"])
        unsigned.close()
        assert backend.list() == ["k"]
    finally:
        server.stop()


def test_the_stream_tag_is_not_the_zmq_tag():
    head = wire.auth_head(b"n" * 16, 1)
    frames = [b"\x01\x80", b"payload"]
    tags = []
    for label in (None, bulk.STREAM_LABEL):
        mac = wire.FrameMac(SECRET, head) if label is None else wire.FrameMac(SECRET, head, label)
        for f in frames:
            mac.frame(len(f))
            mac.update(f)
        tags.append(mac.finalize())
    assert tags[0] != tags[1]
    body, _ = wire.open_frames([*frames, head + tags[0]], SECRET)  # FrameMac is sign()'s construction
    assert body == frames
    with pytest.raises(ProtocolError):
        wire.open_frames([*frames, head + tags[1]], SECRET)


def test_framing_lies_are_refused_and_close_the_stream():
    backend = MemoryStorageUnit("l0", memory_budget=64 * MiB)
    server = StorageUnitServer(backend, shared_memory=False, max_message_bytes=8 * MiB).start()
    try:
        bad_magic = _send_raw(server, b"XXXX" + bytes(8))
        assert bad_magic["error"] == "ProtocolError" and "magic" in bad_magic["message"]
        huge = bulk._PREFIX.pack(bulk.MAGIC, 10, 1) + (64 * MiB).to_bytes(8, "little")
        too_big = _send_raw(server, huge)
        assert too_big["error"] == "ProtocolError" and "exceeds" in too_big["message"]
        assert backend.list() == [] and server.bulk.untyped == 0
    finally:
        server.stop()


@pytest.mark.parametrize("secret", [None, SECRET], ids=["open", "mac"])
def test_hostile_bytes_on_the_stream_are_typed_refusals_and_the_unit_keeps_serving(secret):
    backend = MemoryStorageUnit("h0", memory_budget=64 * MiB)
    server = StorageUnitServer(backend, shared_memory=False, secret=secret, max_message_bytes=4 * MiB).start()
    server.bulk.stall_s = 0.2
    rng = np.random.default_rng(7)
    good = _put_message("k", np.arange(4, dtype=np.int8), secret)
    try:
        for i in range(40):
            n_control = int(rng.integers(0, 64))
            body = rng.integers(0, 256, size=int(rng.integers(0, 300)), dtype=np.uint8).tobytes()
            kind = i % 4
            if kind == 0:
                data = body  # noise
            elif kind == 1:
                data = bulk._PREFIX.pack(bulk.MAGIC, n_control, int(rng.integers(0, 4))) + body
            elif kind == 2:  # a real message with bytes flipped or cut
                cut = bytearray(good)
                cut[int(rng.integers(0, len(cut)))] ^= 0xFF
                data = bytes(cut[: int(rng.integers(1, len(cut) + 1))])
            else:  # a real header, a control frame that is not msgpack
                data = good[:12] + body
            sock = socket.create_connection(("127.0.0.1", server.bulk.port), timeout=5)
            sock.settimeout(5)
            try:  # the unit answers (a typed refusal) and may drop the connection; either way it ends
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(1 << 16):
                    pass
            except (ConnectionResetError, BrokenPipeError, OSError) as exc:
                assert not isinstance(exc, socket.timeout), "the unit neither answered nor dropped the stream"
            sock.close()
        assert server.bulk.untyped == 0 and backend.list() in ([], ["k"])
        remote = RemoteStorageUnit.describe("h0", server.address, timeout_s=5, secret=secret)
        remote.put("after", _payload(9))
        np.testing.assert_array_equal(remote.get("after"), _payload(9))
        remote.close()
    finally:
        server.stop()


@pytest.mark.parametrize("secret", [None, SECRET], ids=["open", "mac"])
def test_messages_sent_back_to_back_are_each_read_whole(secret):
    """Reads ahead of a message (its header, small payloads) never lose or reorder the next one's bytes."""
    backend = MemoryStorageUnit("p0", memory_budget=64 * MiB)
    server = StorageUnitServer(backend, shared_memory=False, secret=secret).start()
    small, big = np.arange(100, dtype=np.int64), _payload(8)
    data = b"".join(_put_message(k, a, secret, seq=i + 1) for i, (k, a) in
                    enumerate([("s1", small), ("b1", big), ("s2", small + 1)]))
    sock = socket.create_connection(("127.0.0.1", server.bulk.port), timeout=5)
    try:
        sock.sendall(data)
        conn = bulk.Conn(sock, lambda quiet: None)
        replies = [wire.decode_control(bulk.read_message(conn, secret=secret, alloc=bulk.RecvPool().take,
                                                         max_bytes=1 << 30)[0]) for _ in range(3)]
        assert [r["ok"] for r in replies] == [True, True, True]
        np.testing.assert_array_equal(backend.get("s2"), small + 1)
        np.testing.assert_array_equal(backend.get("b1"), big)
    finally:
        sock.close()
        server.stop()


def _rss_bytes(pid: str = "self") -> int:
    """Resident memory of a process, its shared-memory pages included."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_an_unauthenticated_512_mib_declaration_allocates_nothing_and_moves_unit_memory_by_less_than_the_cap():
    backend = MemoryStorageUnit("d0", memory_budget=64 * MiB)
    server = StorageUnitServer(backend, shared_memory=True, secret=SECRET, max_message_bytes=1 << 34).start()
    allocated = []
    receive = server.bulk._alloc
    server.bulk._alloc = lambda n: (allocated.append(n), receive(n))[1]
    cap = 16 * MiB
    sock = socket.create_connection(("127.0.0.1", server.bulk.port), timeout=5)
    try:
        rss, shm_before = _rss_bytes(), server.shm.stats()["shm_bytes"]
        # A peer without the secret declares one 512 MiB payload, sends a forged head tag and a few
        # bytes, and keeps the connection open.
        prefix = bulk._PREFIX.pack(bulk.MAGIC, 10, 1)
        forged = prefix + wire.auth_head(b"x" * 16, 1) + (512 * MiB).to_bytes(8, "little") + bytes(16)
        sock.sendall(forged + bytes(4096))
        _wait_for(lambda: server.bulk.rejected == 1, "the forged head is refused")
        assert allocated == []
        assert _rss_bytes() - rss < cap
        assert server.shm.stats()["shm_bytes"] == shm_before
        assert backend.list() == [] and server.bulk.untyped == 0
        # A client with the secret is still served.
        remote = RemoteStorageUnit.describe("d0", server.address, timeout_s=10, secret=SECRET)
        remote.put("k", _payload(3))
        np.testing.assert_array_equal(remote.get("k"), _payload(3))
        remote.close()
    finally:
        sock.close()
        server.stop()
        backend.close()


def test_a_replayed_head_is_refused_before_its_payloads_are_received():
    backend = MemoryStorageUnit("r0", memory_budget=64 * MiB)
    server = StorageUnitServer(backend, shared_memory=False, secret=SECRET).start()
    allocated = []
    receive = server.bulk._alloc
    server.bulk._alloc = lambda n: (allocated.append(n), receive(n))[1]
    try:
        good = _put_message("k", _payload(4), SECRET, seq=7)
        assert _send_raw(server, good)["ok"] is True
        sizes = list(allocated)
        replay = _send_raw(server, good[:64 + 8 + 16])  # the head alone: its payload never sent
        assert replay["ok"] is False and "replay" in replay["message"]
        assert allocated == sizes and backend.list() == ["k"]
    finally:
        server.stop()
        backend.close()


def test_the_unit_zmq_socket_takes_no_frame_larger_than_its_small_cap_when_it_has_a_bulk_stream():
    from dressage.tq.storage.config import UNIT_ZMQ_MAX_MESSAGE

    backend = MemoryStorageUnit("z0", memory_budget=64 * MiB)
    with_bulk = StorageUnitServer(backend, shared_memory=False, secret=SECRET)
    without = StorageUnitServer(backend, shared_memory=False, secret=SECRET, bulk=False, max_message_bytes=1 << 30)
    try:
        assert with_bulk.rpc.max_message_bytes == UNIT_ZMQ_MAX_MESSAGE < with_bulk.bulk.max_message_bytes
        assert without.rpc.max_message_bytes == 1 << 30
    finally:
        with_bulk.stop()
        without.stop()
        backend.close()


@pytest.mark.parametrize("shared_memory", [False, True], ids=["stream", "shm"])
def test_a_get_answer_is_bounded_and_the_client_pages_through_the_rest(shared_memory):
    backend = MemoryStorageUnit("p0", memory_budget=256 * MiB)
    server = StorageUnitServer(backend, shared_memory=shared_memory, secret=SECRET, max_reply_bytes=5 * MiB).start()
    remote = RemoteStorageUnit.describe("p0", server.address, timeout_s=10, secret=SECRET)
    answers = []
    handle = server._serve

    def spy(control, frames, tags):
        reply, payloads, forwarded = handle(control, frames, tags)
        if control["op"] == "get":
            answers.append((len(reply["arrays"]), sum(p.nbytes for p in payloads)))
        return reply, payloads, forwarded

    server.bulk._handler = spy
    try:
        arrays = [_payload(i, 2 * MiB) for i in range(7)] + [_payload(99, 12 * MiB)]
        for i, a in enumerate(arrays):
            remote.put(f"k{i}", a)
        got = remote.get_many([(f"k{i}", 0, None) for i in range(len(arrays))] + [("k1", 2, 5)])
        for a, b in zip(arrays, got):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(got[-1], arrays[1][2:5])
        if shared_memory:  # on the unit's host the answer names segments: no payload bytes to bound
            assert answers == [(len(arrays) + 1, 0)]
            return
        # 2 MiB blobs two to an answer (a third would pass 5 MiB), the 12 MiB blob alone, the slice last.
        assert [n for n, _ in answers] == [2, 2, 2, 1, 1, 1]
        assert sum(n for n, _ in answers) == len(arrays) + 1
        assert all(nbytes <= 5 * MiB or n == 1 for n, nbytes in answers)
    finally:
        remote.close()
        server.stop()
        backend.close()


def test_an_exact_take_allocates_no_slack_and_reuses_a_free_buffer_of_its_class():
    pool = bulk.RecvPool(cap_bytes=16 * MiB)
    assert pool.size_class(MiB + 10) == pool.size_class(MiB + 5) == pool.size_class(MiB + 11)
    a = pool.take(MiB + 10, exact=True)  # no size-class slack: the page a landing view needs only
    assert a.nbytes == MiB + 10 and len(a.base) == MiB + 10 + landing.PAGE and pool.pooled_bytes == MiB + 10
    first = id(a.base)
    b = pool.take(MiB + 10, exact=True)  # the first is held: a second buffer
    assert id(b.base) != first and pool.pooled_bytes == 2 * (MiB + 10)
    del a
    c = pool.take(MiB + 5, exact=True)  # a free buffer of the class that is long enough: no new one
    assert id(c.base) == first and c.nbytes == MiB + 5 and pool.pooled_bytes == 2 * (MiB + 10)
    assert pool.reused == 1
    del b, c
    d = pool.take(MiB + 11, exact=True)  # same class, but every free buffer is one byte short
    assert len(d.base) == MiB + 11 + landing.PAGE and pool.pooled_bytes == 3 * MiB + 31


def test_a_copy_of_a_large_read_lands_in_a_pooled_buffer_it_owns_alone(monkeypatch):
    from dressage.tq.client.client import _owned_copy

    monkeypatch.setattr(bulk, "_shared", bulk.RecvPool())
    src = np.arange(3 * MiB // 4, dtype=np.int32).reshape(-1, 4)
    first = _owned_copy(src)
    assert first.flags.writeable and first.dtype == src.dtype and first.shape == src.shape
    np.testing.assert_array_equal(first, src)
    held = id(first.base)
    second = _owned_copy(src)  # the first is still held: never handed out twice
    assert id(second.base) != held
    second[0, 0] = -1
    assert first[0, 0] == 0 and src[0, 0] == 0
    del first
    third = _owned_copy(src[::-1])  # the first was dropped: its buffer again, a non-contiguous source in order
    assert id(third.base) == held and np.array_equal(third, src[::-1])
    small = _owned_copy(src[:MiB // 32])  # under RecvPool.MIN_BYTES: a plain copy
    assert small.base is None and small.flags.writeable and np.array_equal(small, src[:MiB // 32])


def test_the_work_after_a_reply_holds_none_of_the_replys_views(unit):
    """A reader that deletes a blob as soon as its get is answered finds it released: the bulk thread's
    work after the reply (``after_reply``, the unit's checksum pass) runs once the reply's frames are
    gone, so the deleted blob's buffer goes back to the unit's pool (held views would keep it out)."""
    backend, server, remote, _ = unit
    in_after, go_on = threading.Event(), threading.Event()
    original, replies = server.bulk.after_reply, []

    # Installed before the put: the put's work after its reply (which may still be running once the put
    # returned, on the connection the get then uses) runs as ever; the get's (the second) holds its thread.
    def after_reply():
        replies.append(1)
        if len(replies) == 1:
            if original is not None:
                original()
            return
        in_after.set()
        go_on.wait(10)

    server.bulk.after_reply = after_reply
    remote.put("k", _payload(1, 2 * MiB))
    try:
        got = remote.get("k")
        np.testing.assert_array_equal(got, _payload(1, 2 * MiB))
        del got
        assert in_after.wait(10)  # the bulk thread is in its work after the reply, and stays there
        assert remote.delete(["k"]) == 1  # on the ZMQ socket, served by another thread
        assert backend.usage()["pooled_bytes"] == 2 * MiB
    finally:
        go_on.set()


class _Feed:
    """Stands in for a socket: serves ``data`` to ``recv_into`` and records how much each call asked for."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at, self.asked = data, 0, []

    def recv_into(self, mv) -> int:
        self.asked.append(len(mv))
        k = min(len(mv), len(self.data) - self.at)
        mv[:k] = self.data[self.at:self.at + k]
        self.at += k
        return k


def test_a_large_payload_is_received_and_tagged_in_pieces_of_at_most_recv_bytes():
    """A receiver asks the socket for at most ``RECV_BYTES`` at a time and tags each piece as it lands (the
    bytes queued behind a piece stay warm); the payload and its tag are those of the whole, read at once."""
    payload = np.random.default_rng(3).integers(0, 256, 3 * MiB + 5, dtype=np.uint8)
    feed = _Feed(payload.tobytes())
    out = np.zeros_like(payload)
    key = wire.payload_key(SECRET, wire.auth_head(seq=1))
    mac = wire.PayloadMac(key, 0, payload.nbytes)
    bulk.Conn(feed, lambda quiet: None).recv_into(memoryview(out), mac)
    np.testing.assert_array_equal(out, payload)
    assert max(feed.asked) == bulk.RECV_BYTES < bulk.CHUNK_BYTES
    assert len(feed.asked) == -(-payload.nbytes // bulk.RECV_BYTES)
    whole = wire.PayloadMac(key, 0, payload.nbytes)
    whole.update(memoryview(payload))
    assert mac.finalize() == whole.finalize()
