"""Wire fuzzing: every hostile frame is a typed error, and the unit (or Controller) keeps serving."""

from __future__ import annotations

import pathlib
import pickle

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dressage.errors import ProtocolError, RowRangeError
from dressage.tq import FieldRef
from dressage.tq.transport import wire
from dressage.tq.directory.controller import Controller
from dressage.tq.directory.entries import UnitInfo
from dressage.tq.directory.service import ControllerServer, RemoteController
from dressage.tq.storage import MemoryStorageUnit, SpillStorageUnit
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.storage.server import HEARTBEAT_MAX_MESSAGE, StorageUnitServer
from dressage.testing.wirefuzz import KINDS, fuzz_server, hostile_message

SECRET = b"fuzz-secret-0123456789"
TYPED = {"TransferQueueError", "KeyNotFoundError", "RowRangeError", "StorageUnitUnavailable", "StorageFullError",
         "ProtocolError", "IntegrityError", "ConfigError"}

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_decoder_raises_only_protocol_error_on_arbitrary_bytes(data):
    try:
        assert isinstance(wire.decode_control(data), dict)
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), msgpack_values, max_size=5), st.integers(0, 255))
def test_decoder_accepts_only_its_version_and_maps(control, version):
    frame = bytes((version,)) + msgpack.packb(control, use_bin_type=True)
    if version != wire.VERSION:
        with pytest.raises(ProtocolError, match="version"):
            wire.decode_control(frame)
    else:
        assert wire.decode_control(frame) == control


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), msgpack_values, msgpack_values)
@example(b"\x00" * 8, "0:", [1])  # numpy: ValueError
@example(b"\x00" * 8, ",", [1])  # numpy: SyntaxError
@example(b"\x00" * 8, "(", [1])
def test_payload_decoder_raises_only_protocol_error(frame, dtype, shape):
    try:
        wire.array_from_frame(frame, dtype, shape)
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(msgpack_values)
def test_fieldref_wire_form_rejects_garbage_with_typed_errors(obj):
    try:
        FieldRef.from_wire(obj)
    except (ProtocolError, RowRangeError):
        pass


@pytest.fixture(scope="module", params=[None, SECRET], ids=["open", "hmac"])
def unit_server(request, tmp_path_factory):
    backend = SpillStorageUnit("fz", memory_budget=1 << 20, spill_dir=str(tmp_path_factory.mktemp("spill")))
    server = StorageUnitServer(backend, shared_memory=False, secret=request.param).start()
    good = RemoteStorageUnit("fz", server.address, timeout_s=5, secret=request.param)
    good.put("good", np.arange(100, dtype=np.int64))
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(server.address)
    yield server, good, raw, request.param
    raw.close(0)
    good.close()
    server.stop()
    backend.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=4) | st.builds(
    lambda c, p: wire.encode(c, p), st.dictionaries(st.sampled_from(["op", "id", "items", "reqs", "keys", "key",
                                                                      "shm"]), msgpack_values, max_size=5),
    st.lists(st.binary(max_size=40), max_size=3)))
def test_running_unit_answers_every_hostile_message_with_a_typed_error(unit_server, frames):
    server, good, raw, secret = unit_server
    untyped = server.rpc.untyped
    raw.send_multipart(frames)
    assert raw.poll(5000), "the unit did not answer"
    reply = raw.recv_multipart()
    if secret is not None:
        reply = wire.verify_mac(reply, secret)
    control = wire.decode_control(reply[0])
    assert control["ok"] or control["error"] in TYPED
    assert server.rpc.untyped == untyped
    np.testing.assert_array_equal(good.get("good", 10, 12), [10, 11])


def test_generated_attacks_of_every_kind_leave_the_unit_serving(unit_server):
    server, good, _, secret = unit_server
    rng = np.random.default_rng(7)
    assert {k for k in KINDS} == {hostile_message(rng, k)[0] for k in KINDS}

    def check():
        np.testing.assert_array_equal(good.get("good", 0, 3), [0, 1, 2])

    report = fuzz_server(server.address, 400, seed=3, secret=secret, check_valid=check,
                         untyped_counter=lambda: server.rpc.untyped)
    assert report.wire_inputs == 400 and set(report.by_kind) == set(KINDS)
    assert report.wire_untyped_errors == 0 and report.wire_no_reply == 0 and report.valid_after
    assert set(good.list()) <= {"good", "fz"}  # only the fuzzer's own valid puts, no pickled "evil"


def test_controller_socket_survives_the_same_attacks():
    ctl = Controller([UnitInfo("u0")])
    server = ControllerServer(ctl).start()
    good = RemoteController(server.address, timeout_s=5)
    try:
        report = fuzz_server(server.address, 400, seed=11, check_valid=good.ping,
                             untyped_counter=lambda: server.rpc.untyped)
        assert report.wire_untyped_errors == 0 and report.wire_no_reply == 0 and report.valid_after
        assert ctl.unit_states()["u0"]["state"] == "live"
    finally:
        good.close()
        server.stop()


def test_no_tq_socket_code_can_unpickle():
    """Nothing on a TQ socket is ever unpickled: no pickle loads and no pyzmq *_pyobj helpers."""
    root = pathlib.Path(__import__("dressage.tq", fromlist=["x"]).__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        for banned in ("pickle.loads", "pickle.load(", "recv_pyobj", "send_pyobj", "recv_serialized"):
            assert banned not in text, f"{path.name} uses {banned}"
    with pytest.raises(ProtocolError, match="pickle"):
        wire.decode_control(pickle.dumps({"op": "ping"}))


@pytest.fixture(params=[None, SECRET], ids=["open", "hmac"])
def beat_server(request):
    backend = MemoryStorageUnit("hb", memory_budget=1 << 20)
    server = StorageUnitServer(backend, shared_memory=False, secret=request.param).start()
    yield server, request.param
    server.stop()
    backend.close()


def _send(address, frames, watch):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED) if watch else None
    sock.connect(address)
    sock.send_multipart(frames)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    if monitor is not None:
        poller.register(monitor, zmq.POLLIN)
    ready = dict(poller.poll(5000))
    reply = sock.recv_multipart() if sock in ready else None
    dropped = monitor is not None and monitor in ready
    if monitor is not None:
        sock.disable_monitor()
        monitor.close(0)
    sock.close(0)
    return reply, dropped


def test_heartbeat_socket_drops_a_frame_over_its_limit_and_answers_everything_else(beat_server):
    """The fuzzer's "oversized" control frame (16 MiB + 9 bytes) against the 64 KiB heartbeat socket:
    libzmq closes the connection while reading it, so it never reaches the handler (no reply can exist);
    a bad frame within the limit gets a typed refusal, and a ping still works after both."""
    server, secret = beat_server
    address = server.heartbeat.address
    big = [bytes((wire.VERSION,)) + b"\x00" * (16 * 1024 * 1024 + 8)]
    if secret is not None:
        big.append(wire.sign(big, secret))
    reply, dropped = _send(address, big, watch=True)
    assert reply is None and dropped and server.heartbeat.rejected == 0
    small = wire.encode({"op": "get", "id": 4, "reqs": [["k", 0, None]]})
    if secret is not None:
        small.append(wire.sign(small, secret, nonce=b"h" * 16, seq=1))
    reply, _ = _send(address, small, watch=False)
    assert reply is not None
    control = wire.decode_control((wire.verify_mac(reply, secret) if secret is not None else reply)[0])
    assert control["ok"] is False and control["error"] == "ProtocolError" and control["id"] == 4
    assert "only ping" in control["message"]
    probe = RemoteStorageUnit("hb", address, timeout_s=5, secret=secret)
    try:
        probe.ping()
    finally:
        probe.close()


def test_fuzzer_counts_an_over_limit_drop_as_the_answer_but_silence_as_a_hang(beat_server):
    server, secret = beat_server
    address = server.heartbeat.address
    seed = 2  # draws the 16 MiB control frame once in 250 (message 215 open, 100 with a secret)
    report = fuzz_server(address, 250, seed=seed, secret=secret, max_frame_bytes=HEARTBEAT_MAX_MESSAGE,
                         untyped_counter=lambda: server.heartbeat.untyped)
    assert report.wire_dropped == 1 and report.wire_no_reply == 0 and report.wire_untyped_errors == 0
    assert sum(report.errors_seen.values()) + report.wire_ok_replies + report.wire_dropped == 250
    # Without the socket's limit the driver cannot tell the drop from a hang, and must not excuse it.
    blind = fuzz_server(address, 250, seed=seed, secret=secret, timeout_s=1.0)
    assert blind.wire_no_reply == 1 and blind.wire_dropped == 0
