"""Access: loopback by default; any other interface needs a secret, and then every message carries a
MAC (GMAC under a per-message key derived with HMAC-SHA256); a frame without a valid one is
ProtocolError and the unit keeps serving."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from dressage.errors import ConfigError, ProtocolError
from dressage.tq import TransferQueue, TransferQueueClient, TransferQueueConfig
from dressage.tq.transport import wire
from dressage.tq.config import SECRET_ENV, is_loopback
from dressage.tq.storage import MemoryStorageUnit
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.storage.server import StorageUnitServer

SECRET = b"0123456789abcdef-test-secret"


def test_loopback_is_the_default_and_other_hosts_need_a_secret(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert TransferQueueConfig().host == "127.0.0.1" and TransferQueueConfig().secret is None
    assert is_loopback("127.0.0.1") and is_loopback("127.1.2.3") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5") and not is_loopback("127.example.com")
    with pytest.raises(ConfigError, match=r"transfer_queue\.host.*not a loopback.*auth_secret"):
        TransferQueueConfig(host="0.0.0.0")
    with pytest.raises(ConfigError, match=r"auth_secret.*16"):
        TransferQueueConfig(host="0.0.0.0", auth_secret="short")
    assert TransferQueueConfig(host="0.0.0.0", auth_secret=SECRET.decode()).secret == SECRET
    monkeypatch.setenv(SECRET_ENV, SECRET.decode())
    assert TransferQueueConfig(host="0.0.0.0").secret == SECRET


@pytest.fixture
def guarded():
    backend = MemoryStorageUnit("a0", memory_budget=1 << 20)
    server = StorageUnitServer(backend, shared_memory=False, secret=SECRET).start()
    yield server
    server.stop()
    backend.close()


def _raw_roundtrip(address: str, frames: list) -> list:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart(frames)
        assert sock.poll(5000), "no reply: the unit must answer even an unauthenticated frame"
        return sock.recv_multipart()
    finally:
        sock.close(0)


def test_frames_without_a_valid_mac_are_rejected_and_the_unit_keeps_serving(guarded):
    good = RemoteStorageUnit("a0", guarded.address, timeout_s=5, secret=SECRET)
    good.put("k", np.arange(6, dtype=np.int32))
    request = wire.encode({"op": "get", "id": 1, "reqs": [["k", 0, None]]})
    for frames in (request, request + [b"\x00" * 32], request + [wire.sign(request, b"another-secret-16b")]):
        reply = wire.verify_mac(_raw_roundtrip(guarded.address, frames), SECRET)  # refusals are signed too
        control = wire.decode_control(reply[0])
        assert control["ok"] is False and control["error"] == "ProtocolError"
        assert "unauthenticated" in control["message"]
    tampered = request + [wire.sign(request, SECRET)]
    tampered[0] = wire.encode({"op": "delete", "id": 1, "keys": ["k"]})[0]
    assert wire.decode_control(wire.verify_mac(_raw_roundtrip(guarded.address, tampered), SECRET)[0])["ok"] is False
    for secret in (None, b"not-the-right-secret"):
        intruder = RemoteStorageUnit("a0", guarded.address, timeout_s=5, secret=secret)
        with pytest.raises(ProtocolError):
            intruder.get("k")
        intruder.close()
    np.testing.assert_array_equal(good.get("k"), np.arange(6))
    assert good.stats()["rejected_frames"] >= 6
    good.close()


def test_a_deployment_on_all_interfaces_authenticates_every_client():
    with TransferQueue.start({"host": "0.0.0.0", "auth_secret": SECRET.decode(), "retention_s": None}) as tq:
        spec = tq.client_spec()
        assert spec["auth_secret"] == SECRET.decode()
        remote = TransferQueueClient.connect(spec)
        ref = remote.put("logprobs", np.arange(5, dtype=np.float32))
        np.testing.assert_array_equal(remote.get(ref), np.arange(5))
        unsigned = TransferQueueClient.connect({**spec, "auth_secret": None})
        with pytest.raises(ProtocolError):
            unsigned.get(ref)
        with pytest.raises(ProtocolError):
            unsigned.put("logprobs", np.zeros(2, dtype=np.float32))
        unsigned.close()
        assert remote.delete([ref]) == 1
        remote.close()


def test_the_mac_covers_every_payload_byte_and_frame_boundary_and_never_reuses_a_key():
    payload = np.arange(3 << 18, dtype=np.uint8)  # 768 KiB: a frame sent without a copy
    frames = wire.encode({"op": "put", "id": 7}, [payload, b"tail"])
    trailer = wire.sign(frames, SECRET, nonce=b"n" * 16, seq=3, time_ms=1000)
    assert len(trailer) == wire.TRAILER_BYTES
    body, auth = wire.open_frames([*frames, trailer], SECRET)
    assert (auth.nonce, auth.seq, auth.time_ms) == (b"n" * 16, 3, 1000) and len(body) == 3
    # Same frames, nonce, seq and time: a fresh salt gives a different key and tag, and both verify.
    again = wire.sign(frames, SECRET, nonce=b"n" * 16, seq=3, time_ms=1000)
    assert again[:32] == trailer[:32] and again[32:48] != trailer[32:48] and again[48:] != trailer[48:]
    wire.open_frames([*frames, again], SECRET)
    flipped = payload.copy()
    flipped[-1] ^= 1
    resplit = [frames[0], payload.tobytes() + b"ta", b"il"]
    for bad in ([frames[0], flipped, b"tail", trailer], [*resplit, trailer],
                [*frames, trailer[:40] + bytes([trailer[40] ^ 1]) + trailer[41:]],
                [*frames, wire.sign(frames, b"another-secret-16b", nonce=b"n" * 16, seq=3, time_ms=1000)]):
        with pytest.raises(ProtocolError, match="MAC does not match"):
            wire.open_frames(bad, SECRET)


def test_a_frame_tag_is_the_same_however_the_bytes_are_fed_and_changes_with_any_byte():
    import os

    secret, head = os.urandom(32), wire.auth_head()
    data = bytearray(os.urandom(3 * wire._STREAM_AFTER))

    def tag(pieces):
        mac = wire.FrameMac(secret, head)
        for piece in pieces:
            mac.update(piece)
        return mac.finalize()

    whole = tag([bytes(data)])
    # Held (under the streaming threshold), crossing it, and streamed: one tag.
    assert tag([data[:10], data[10:wire._STREAM_AFTER + 5], memoryview(data)[wire._STREAM_AFTER + 5:]]) == whole
    assert tag([data[i:i + 4096] for i in range(0, len(data), 4096)]) == whole
    assert len(whole) == wire.MAC_BYTES
    small = tag([data[:100]])
    assert tag([data[:40], data[40:100]]) == small != tag([data[:99]])
    for at in (0, 50, wire._STREAM_AFTER + 1, len(data) - 1):
        data[at] ^= 1
        assert tag([bytes(data)]) != whole
        data[at] ^= 1
    assert wire.FrameMac(os.urandom(32), head).finalize() != wire.FrameMac(secret, head).finalize()
    assert wire.FrameMac(secret, head, b"other-label\x00").finalize() != wire.FrameMac(secret, head).finalize()
