"""Payload tags: a large payload keeps its writer's tag in the StorageUnit and is answered with it unread;
the reader checks the bytes against the writer's tag, end to end."""

from __future__ import annotations

import socket
import threading

import numpy as np
from hypothesis import given, settings, strategies as st
import pytest

from dressage.errors import IntegrityError, ProtocolError
from dressage.tq.storage import MemoryStorageUnit, memory as memory_module
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.storage.server import StorageUnitServer
from dressage.tq.storage.spill import SpillStorageUnit
from dressage.tq.transport import bulk, shm, wire

SECRET = b"payload-tag-secret-0123456789"
MiB = 1 << 20


def _payload(seed: int, nbytes: int = 2 * MiB) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).reshape(-1, 256)


@pytest.fixture
def served():
    backend = MemoryStorageUnit("t0", memory_budget=256 * MiB)
    server = StorageUnitServer(backend, shared_memory=False, secret=SECRET).start()
    remote = RemoteStorageUnit.describe("t0", server.address, timeout_s=10, secret=SECRET)
    yield backend, server, remote
    remote.close()
    server.stop()
    backend.close()


def _corrupt(backend: MemoryStorageUnit, key: str, at: int = 12345) -> None:
    """Flip one stored byte, as a fault in the unit's memory would (the unit's own buffer stays writable
    underneath the read-only blob)."""
    flat = backend._blobs[key].reshape(-1).view(np.uint8)
    flat.flags.writeable = True
    flat[at] ^= 0xFF


def test_a_whole_blob_is_answered_with_its_writers_tag_and_no_byte_of_it_is_hashed_in_the_unit(served, monkeypatch):
    backend, server, remote = served
    hashed = []
    monkeypatch.setattr(memory_module, "checksum", lambda a: hashed.append(a.nbytes))
    monkeypatch.setattr(memory_module, "verify_rows", lambda *a: hashed.append("verify"))
    data = [_payload(i) for i in range(3)]
    remote.put_many([(f"k{i}", a) for i, a in enumerate(data)])
    got = remote.get_many([(f"k{i}", 0, None) for i in range(3)])
    for a, b in zip(data, got):
        np.testing.assert_array_equal(a, b)
    assert hashed == []  # neither after the put (no checksum pass) nor for the get
    assert set(backend._tags) == {"k0", "k1", "k2"} and all(len(t.tag) == 16 for t in backend._tags.values())


def test_bytes_changed_in_the_unit_fail_the_readers_check_of_the_writers_tag(served):
    backend, server, remote = served
    a = _payload(1)
    remote.put("k", a)
    _corrupt(backend, "k")
    with pytest.raises(IntegrityError, match="StorageUnit t0, reading 'k': .* not the bytes their writer tagged"):
        remote.get("k")
    # Rows of it, read the unit's way (checksums made once the writer's tag matched), fail there too.
    with pytest.raises(IntegrityError, match="not the ones their writer tagged"):
        remote.get_many([("k", 10, 20)])
    # A blob nothing changed still reads, whole or in part, and its rows are verified by checksums made
    # after its tag was checked.
    remote.put("ok", a)
    np.testing.assert_array_equal(remote.get_many([("ok", 10, 20)])[0], a[10:20])
    assert backend._sums["ok"] is not None
    np.testing.assert_array_equal(remote.get("ok"), a)


def test_small_payloads_are_tagged_with_their_message_and_not_kept(served):
    backend, server, remote = served
    small = np.arange(wire.TAGGED_MIN_BYTES // 8 - 1, dtype=np.int64)
    big = _payload(2)
    remote.put_many([("s", small), ("b", big)])
    assert set(backend._tags) == {"b"}
    s, b = remote.get_many([("s", 0, None), ("b", 0, None)])
    np.testing.assert_array_equal(s, small)
    np.testing.assert_array_equal(b, big)


def test_a_blob_that_spills_is_read_back_from_its_file():
    backend = SpillStorageUnit("sp", memory_budget=3 * MiB)
    server = StorageUnitServer(backend, shared_memory=False, secret=SECRET).start()
    remote = RemoteStorageUnit.describe("sp", server.address, timeout_s=10, secret=SECRET)
    try:
        data = [_payload(i) for i in range(3)]
        infos = remote.put_many([(f"k{i}", a) for i, a in enumerate(data)])
        assert [i.spilled for i in infos] == [False, True, True]
        assert set(backend._tags) == {"k0"}  # a spilled blob is served from its file, with its checksums
        for a, b in zip(data, remote.get_many([(f"k{i}", 0, None) for i in range(3)])):
            np.testing.assert_array_equal(a, b)
    finally:
        remote.close()
        server.stop()
        backend.close()


class _Pair:
    """Two connected bulk Conns: ``send`` writes a message on one end, ``read`` reads it on the other."""

    def __init__(self) -> None:
        a, b = socket.socketpair()
        for s in (a, b):
            s.settimeout(5)
        self.out, self.into = bulk.Conn(a, lambda quiet: None), bulk.Conn(b, lambda quiet: None)

    def send(self, data: bytes) -> None:
        """In the background: the socket buffers hold less than one message."""
        def run() -> None:
            try:
                self.out.sock.sendall(data)
            except OSError:  # the reader refused the message and the pair was closed
                pass

        threading.Thread(target=run, daemon=True).start()

    def read(self) -> bulk.Received:
        return bulk.read_message(self.into, secret=SECRET, alloc=lambda n: np.empty(n, np.uint8), max_bytes=1 << 30)

    def close(self) -> None:
        self.out.close()
        self.into.close()


def _message(control: dict, payloads, forwarded=None, nonce: bytes = b"w" * 16) -> bytes:
    class Capture:
        def __init__(self) -> None:
            self.data = bytearray()

        def send(self, mv, mac=None):
            if mac is not None:
                mac.update(mv)
            self.data += bytes(mv)

    out = Capture()
    bulk.write_message(out, wire.encode(control)[0], payloads, secret=SECRET, nonce=nonce, seq=1,
                       forwarded=forwarded)
    return bytes(out.data)


def test_a_forwarded_payload_opens_only_as_the_bytes_its_writer_tagged():
    pair = _Pair()
    try:
        a, b = _payload(5), _payload(6)
        pair.send(_message({"op": "put"}, [a, b]))
        first = pair.read()
        tag_a, tag_b = first.tags
        assert tag_a.index == 0 and tag_b.index == 1 and tag_a.head == tag_b.head
        # A second message (a unit's answer) forwards both tags, in the other order: the reader checks
        # each payload against its writer's tag under that writer's key.
        pair.send(_message({"op": "get"}, [b, a], forwarded=[tag_b, tag_a], nonce=b"u" * 16))
        second = pair.read()
        np.testing.assert_array_equal(second.payloads[0], b.reshape(-1))
        assert second.tags == [tag_b, tag_a]
        # The same tags over bytes that changed: the message is authentic, the payload is not its writer's.
        changed = a.copy()
        changed[7, 7] ^= 1
        pair.send(_message({"op": "get"}, [b, changed], forwarded=[tag_b, tag_a], nonce=b"u" * 16))
        with pytest.raises(IntegrityError, match=r"payload\(s\) \[1\]"):
            pair.read()
        # A tag of another payload (b's index under a's place) fails the same way.
        pair.send(_message({"op": "get"}, [a], forwarded=[tag_b], nonce=b"u" * 16))
        with pytest.raises(IntegrityError):
            pair.read()
        # The stream stayed in step through both refusals.
        pair.send(_message({"op": "get"}, [a], forwarded=[tag_a], nonce=b"u" * 16))
        np.testing.assert_array_equal(pair.read().payloads[0], a.reshape(-1))
    finally:
        pair.close()


def test_forwarded_tags_are_read_only_from_an_authenticated_peer_and_covered_by_the_message_tag():
    pair = _Pair()
    try:
        a = _payload(7)
        pair.send(_message({"op": "put"}, [a]))
        tag = pair.read().tags[0]
        msg = bytearray(_message({"op": "get"}, [a], forwarded=[tag], nonce=b"u" * 16))
        # The forwarded record follows the prefix, the auth head, one length, the count and the head tag;
        # flip a bit of the writer's tag in it: the message's own tag no longer matches.
        record = bulk._PREFIX.size + wire.AUTH_HEAD_BYTES + 8 + 4 + 16
        changed = bytearray(msg)
        changed[record + 4 + wire.AUTH_HEAD_BYTES + 4] ^= 1
        pair.send(bytes(changed))
        with pytest.raises(ProtocolError, match="the MAC does not match") as err:
            pair.read()
        assert not getattr(err.value, "broken", False)  # read whole: the stream is still in step
        # The count sits under the head tag: a peer cannot make the reader take records it did not tag.
        forged = bytearray(msg)
        forged[record - 16 - 4] = 2
        pair.send(bytes(forged))
        with pytest.raises(ProtocolError, match="head MAC") as err:
            pair.read()
        assert getattr(err.value, "broken", False)
    finally:
        pair.close()


def test_only_a_payload_large_enough_to_carry_a_tag_of_its_own_can_be_forwarded():
    small = np.zeros(wire.TAGGED_MIN_BYTES - 1, np.uint8)
    tag = wire.PayloadTag(bytes(48), 0, bytes(16))
    with pytest.raises(ValueError, match="tag of their own"):
        _message({"op": "get"}, [small], forwarded=[tag])


@pytest.mark.skipif(shm.host_id() is None, reason="no /dev/shm on this host")
def test_a_tagged_blob_a_reader_on_the_units_host_maps_is_checked_by_the_unit_first(monkeypatch):
    """A put from another host lands in a segment of the unit with its writer's tag; a reader on the unit's
    host that maps it gets nothing the unit did not check (no tag travels with a segment's name)."""
    backend = MemoryStorageUnit("h0", memory_budget=64 * MiB)
    server = StorageUnitServer(backend, secret=SECRET).start()
    reader = RemoteStorageUnit.describe("h0", server.address, timeout_s=10, secret=SECRET)
    with monkeypatch.context() as m:  # a client on another host: its host identity differs
        m.setattr(shm, "host_id", lambda: "another-host")
        writer = RemoteStorageUnit.describe("h0", server.address, timeout_s=10, secret=SECRET)
    try:
        a = _payload(8)
        writer.put_many([("big", a), ("small", np.arange(10))])
        assert "big" in backend._tags and server.shm.locate(backend._blobs["big"]) is not None
        np.testing.assert_array_equal(reader.get("big"), a)  # mapped, checked against digests made after the tag
        writer.put("big2", a)
        _corrupt(backend, "big2")
        # With a key off the segments in the same request the unit answers the plain way: names of
        # segments for what it checked itself.
        with pytest.raises(IntegrityError):
            reader.get_many([("small", 0, None), ("big2", 0, None)])
    finally:
        writer.close()
        reader.close()
        server.stop()
        backend.close()


def _flipped_reading(message: bytes, bit: int) -> bulk.Received:
    """Read ``message`` with one bit flipped, its sender closing after it (a short message ends the stream)."""
    data = bytearray(message)
    data[bit // 8] ^= 1 << (bit % 8)
    a, b = socket.socketpair()
    b.settimeout(5)

    def run() -> None:
        try:
            a.sendall(bytes(data))
            a.shutdown(socket.SHUT_WR)
        except OSError:  # the reader gave up on the message and closed
            pass

    sender = threading.Thread(target=run, daemon=True)
    sender.start()
    try:
        return bulk.read_message(bulk.Conn(b, lambda quiet: None), secret=SECRET,
                                 alloc=lambda n: np.empty(n, np.uint8), max_bytes=1 << 30)
    finally:
        b.close()
        sender.join(5)
        a.close()


def _tagged_messages() -> dict[str, bytes]:
    big, small = _payload(9, wire.TAGGED_MIN_BYTES), np.arange(100, dtype=np.int32)
    put = _message({"op": "put", "n": 1}, [big, small, big[::-1].copy()])
    pair = _Pair()
    try:
        pair.send(put)
        tags = pair.read().tags
    finally:
        pair.close()
    answer = _message({"op": "get"}, [big[::-1].copy(), small, big], forwarded=[tags[2], None, tags[0]],
                      nonce=b"u" * 16)
    return {"put": put, "answer": answer}


_MESSAGES = _tagged_messages()


@settings(max_examples=80, deadline=None)
@given(kind=st.sampled_from(sorted(_MESSAGES)), where=st.floats(0, 1, exclude_max=True))
def test_no_message_with_one_bit_flipped_anywhere_is_accepted(kind, where):
    """Prefix, header, lengths, forwarded tags, control, payloads (tagged here or forwarded), tags: a flip
    anywhere is a typed refusal (or the stream ending), never a message read."""
    message = _MESSAGES[kind]
    with pytest.raises((ProtocolError, IntegrityError, bulk.StreamBroken)):
        _flipped_reading(message, int(where * len(message) * 8))


def test_the_unflipped_messages_are_read():
    for message in _MESSAGES.values():
        got = _flipped_reading(message + b"\0", 8 * len(message))  # the flip lands past the message
        assert got.auth is not None and len(got.payloads) == 3


def test_a_flip_in_any_byte_of_the_framing_control_or_tag_is_refused():
    """Every byte before the payloads (prefix, header, lengths, count, head tag, forwarded tags, control)
    and of the message's tag, one bit each."""
    payload_bytes = 2 * wire.TAGGED_MIN_BYTES + 400
    for kind, message in _MESSAGES.items():
        before = len(message) - payload_bytes - wire.MAC_BYTES
        for i in [*range(before), *range(len(message) - wire.MAC_BYTES, len(message))]:
            with pytest.raises((ProtocolError, IntegrityError, bulk.StreamBroken)):
                _flipped_reading(message, 8 * i + i % 8)
