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
from dressage.tq import FieldRef, wire
from dressage.tq.controller import Controller, UnitInfo
from dressage.tq.controller_service import ControllerServer, RemoteController
from dressage.tq.storage import SpillStorageUnit
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.storage.server import StorageUnitServer
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
