"""The wire is pickle-free and versioned: bad frames are ProtocolError and the unit keeps serving."""

from __future__ import annotations

import pickle

import msgpack
import numpy as np
import pytest
import zmq

from dressage.errors import KeyNotFoundError, ProtocolError
from dressage.tq.transport import wire
from dressage.tq.storage import MemoryStorageUnit
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.storage.server import StorageUnitServer


@pytest.fixture
def served():
    backend = MemoryStorageUnit("w0", memory_budget=1 << 20)
    server = StorageUnitServer(backend).start()
    remote = RemoteStorageUnit("w0", server.address, timeout_s=5)
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(server.address)
    yield server, remote, raw
    raw.close(0)
    remote.close()
    server.stop()
    backend.close()


def roundtrip(raw, frames):
    raw.send_multipart(frames)
    assert raw.poll(5000), "the unit did not answer a bad frame"
    reply = raw.recv_multipart()
    return wire.decode_control(reply[0])


def test_control_frames_start_with_the_version_byte_and_round_trip():
    frames = wire.encode({"op": "x", "n": [1, 2]}, [b"abc"])
    assert frames[0][0] == wire.VERSION and frames[1] == b"abc"
    assert wire.decode_control(frames[0]) == {"op": "x", "n": [1, 2]}


@pytest.mark.parametrize("frame,match", [
    (pickle.dumps({"op": "get", "reqs": []}), "pickle"),
    (pickle.dumps({"op": "get"}, protocol=2), "pickle"),
    (bytes((wire.VERSION + 1,)) + msgpack.packb({"op": "ping"}), "version"),
    (bytes((0,)) + msgpack.packb({"op": "ping"}), "version"),
    (bytes((wire.VERSION,)) + b"\xc1\xc1\xc1", "malformed"),
    (bytes((wire.VERSION,)) + msgpack.packb([1, 2]), "map"),
    (bytes((wire.VERSION,)) + msgpack.packb({"op": msgpack.ExtType(1, b"x")}), "extension"),
    (b"\x01", "short"),
])
def test_decode_rejects_pickle_future_versions_and_garbage(frame, match):
    with pytest.raises(ProtocolError, match=match):
        wire.decode_control(frame)


def test_payload_decoding_refuses_object_dtypes_and_size_mismatch():
    with pytest.raises(ProtocolError, match="plain numeric"):
        wire.array_from_frame(pickle.dumps([1]), "object", [1])
    with pytest.raises(ProtocolError, match="plain numeric"):
        wire.array_from_frame(b"\0" * 8, "V8", [1])
    with pytest.raises(ProtocolError, match="does not match"):
        wire.array_from_frame(b"\0" * 7, "float32", [2])
    with pytest.raises(ProtocolError, match="bad shape"):
        wire.array_from_frame(b"\0" * 4, "float32", [True])


def test_pickle_payload_is_rejected_and_the_unit_keeps_serving(served):
    server, remote, raw = served
    remote.put("good", np.arange(4, dtype=np.int32))
    # A pickled control frame, then a valid control frame whose payload is a pickle claiming object dtype.
    reply = roundtrip(raw, [pickle.dumps({"op": "put", "key": "evil"})])
    assert reply["ok"] is False and reply["error"] == "ProtocolError" and "pickle" in reply["message"]
    evil = pickle.dumps(np.array([1, 2]))
    reply = roundtrip(raw, wire.encode({"op": "put", "key": "evil", "dtype": "object", "shape": [1]}, [evil]))
    assert reply["error"] == "ProtocolError"
    reply = roundtrip(raw, [bytes((9,)) + msgpack.packb({"op": "ping"})])
    assert reply["error"] == "ProtocolError" and "version 9" in reply["message"]
    reply = roundtrip(raw, wire.encode({"op": "get", "reqs": "all"}))
    assert reply["error"] == "ProtocolError"
    reply = roundtrip(raw, wire.encode({"op": "drop_tables"}))
    assert reply["error"] == "ProtocolError"
    # Nothing was half-written and the unit still answers everyone.
    assert not remote.exists("evil")
    np.testing.assert_array_equal(remote.get("good"), np.arange(4))
    assert remote.stats()["rejected_frames"] >= 5
    with pytest.raises(KeyNotFoundError):
        remote.get("evil")


def test_typed_errors_cross_the_wire(served):
    _, remote, _ = served
    with pytest.raises(KeyNotFoundError, match="missing"):
        remote.get("missing")


def test_controller_keeps_answering_while_one_client_never_reads_its_replies():

    from dressage.tq.directory.controller import Controller

    from dressage.tq.directory.entries import UnitInfo
    from dressage.tq.directory.service import ControllerServer, RemoteController

    server = ControllerServer(Controller([UnitInfo("u0")])).start()
    hog = zmq.Context.instance().socket(zmq.DEALER)
    hog.setsockopt(zmq.LINGER, 0)
    hog.setsockopt(zmq.RCVHWM, 10)
    hog.connect(server.address)
    good = RemoteController(server.address, timeout_s=5)
    try:
        for _ in range(3000):  # far beyond the server's send high-water mark for this peer
            hog.send_multipart(wire.encode({"op": "ping", "id": 0}))
        good.ping()
        for i in range(20):  # a server stuck on the hog would fail these by the 5 s request timeout
            assert good.place(f"k{i}", 10) == "u0"
        assert good.total_keys() == 20
    finally:
        hog.close(0)
        good.close()
        server.stop()


@pytest.mark.parametrize("shape", [(0, 4, 2), (5, 0), (0,)])
def test_an_empty_payload_of_any_shape_is_signed_opened_and_decoded(shape):
    # A zero in a memoryview's shape cannot be cast to bytes: an empty R3 slice must still be taggable.
    secret = b"s" * 32
    empty = np.zeros(shape, np.uint8)
    frames = wire.encode({"op": "put"}, [empty])
    body, _ = wire.open_frames([*frames, wire.sign(frames, secret)], secret)
    got = wire.array_from_frame(bytes(wire.payload_bytes(body[1])), "uint8", list(shape))
    assert got.shape == shape and got.dtype == np.uint8
