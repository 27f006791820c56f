"""Hostile control values, oversized frames and replayed authenticated frames: each is a typed
refusal, and the server thread keeps serving."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from dressage.errors import ProtocolError, TransferQueueError
from dressage.tq.transport import wire
from dressage.tq.directory.controller import Controller
from dressage.tq.directory.entries import UnitInfo
from dressage.tq.directory.service import ControllerServer, RemoteController
from dressage.tq.storage import MemoryStorageUnit
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.storage.server import StorageUnitServer
from dressage.tq.transport.zmq import RpcClient, RpcServer

SECRET = b"hardening-secret-0123456789"


def _raw(address, frames, timeout_ms=3000):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart(frames)
        if not sock.poll(timeout_ms):
            return None
        return sock.recv_multipart()
    finally:
        sock.close(0)


@pytest.fixture(params=[None, SECRET], ids=["open", "hmac"])
def controller(request):
    ctl = Controller([UnitInfo("u0", memory_budget=1 << 30)])
    server = ControllerServer(ctl, secret=request.param).start()
    remote = RemoteController(server.address, timeout_s=5, secret=request.param)
    yield ctl, server, remote
    remote.close()
    server.stop()


@pytest.mark.parametrize("items", [
    [["k", 2**64 - 1, "f"]], [["k", 2**48 + 1, "f"]], [["k", -1, "f"]], [["k", True, "f"]],
    [["", 1, "f"]], [["k" * 2000, 1, "f"]], [["k", 1, "f" * 5000]], [["k%d" % i, 1, ""] for i in range(100_001)],
    [["k%d" % i, 2**48, ""] for i in range(70_000)],  # each in range, 2^64 bytes in all
    [["a", 2**48, ""], ["b", 1, ""]],
])
def test_place_with_out_of_range_values_is_refused_and_stats_still_answers(controller, items):
    ctl, server, remote = controller
    rpc = remote._rpc
    with pytest.raises(ProtocolError):
        rpc.call("place", {"items": items})
    assert ctl.total_keys() == 0
    stats = remote.stats()                                      # the RPC thread is alive
    assert stats["u0"]["directory_bytes"] == 0 and server.rpc.untyped == 0


@pytest.mark.parametrize("op,control", [
    ("consumed", {"keys": "k"}), ("touch", {"keys": [None]}), ("delete", {"keys": [1, 2]}), ("state", {"key": "x" * 5000}),
    ("abort", {"keys": ["k"], "unit_down": "yes"}), ("clear", {"batch": None}),
    ("unit_state", {"unit_id": "u0", "state": "dead", "reason": "r" * 10_000}),
    ("add_unit", {"unit": {"unit_id": "u9", "memory_budget": 2**63}}),
    ("add_unit", {"unit": {"unit_id": "u9", "evil": 1}}),
])
def test_every_control_field_is_bounded(controller, op, control):
    ctl, server, remote = controller
    with pytest.raises(ProtocolError):
        remote._rpc.call(op, control)
    assert [u.unit_id for u in ctl.units()] == ["u0"] and ctl.unit_states()["u0"]["state"] == "live"
    assert remote.ping() > 0


def test_a_reply_that_cannot_be_encoded_is_a_typed_error_and_the_thread_lives():
    def handler(control, frames):
        if control["op"] == "huge":
            return {"n": 2**70}, ()                             # msgpack cannot carry it
        return {"n": 1}, ()

    server = RpcServer(handler, name="t").start()
    client = RpcClient(server.address, timeout_s=5, name="t")
    try:
        with pytest.raises(TransferQueueError, match="OverflowError|int too big"):
            client.call("huge")
        assert client.call("small")[0]["n"] == 1
        assert server.untyped == 1
    finally:
        client.close()
        server.stop()


def test_unit_rows_and_shapes_are_bounded():
    backend = MemoryStorageUnit("b0", memory_budget=1 << 20)
    server = StorageUnitServer(backend, shared_memory=False).start()
    unit = RemoteStorageUnit("b0", server.address, timeout_s=5)
    try:
        unit.put("k", np.arange(4, dtype=np.int32))
        for reqs in ([["k", 2**63, None]], [["k", 0, -2**63]], [["k", 0, 1]] * 100_001):
            with pytest.raises(ProtocolError):
                unit._rpc.call("get", {"reqs": reqs})
        with pytest.raises(ProtocolError):
            unit._rpc.call("put", {"items": [["k2", "int32", [2**60]]]}, [b""])
        np.testing.assert_array_equal(unit.get("k"), np.arange(4))
    finally:
        unit.close()
        server.stop()
        backend.close()


def test_a_frame_over_the_socket_limit_is_not_read_and_a_large_message_is_refused_before_its_mac():
    served = []
    server = RpcServer(lambda c, f: (served.append(c["op"]) or {}, ()), name="t", secret=SECRET,
                       max_message_bytes=1 << 20).start()
    client = RpcClient(server.address, timeout_s=5, name="t", secret=SECRET)
    try:
        big = wire.encode({"op": "x", "id": 1}) + [b"\0" * (2 << 20), b"\0" * wire.TRAILER_BYTES]
        assert _raw(server.address, big, timeout_ms=1000) is None     # libzmq dropped the peer mid-frame
        assert server.rejected == 0 and served == []
        parts = wire.encode({"op": "x", "id": 1}) + [b"\0" * (600 << 10)] * 2 + [b"\0" * wire.TRAILER_BYTES]
        reply = wire.verify_mac(_raw(server.address, parts), SECRET)
        control = wire.decode_control(reply[0])
        assert control["ok"] is False and "exceeds" in control["message"] and served == []
        client.call("ok")
        assert served == ["ok"]
    finally:
        client.close()
        server.stop()


def test_a_replayed_authenticated_request_is_refused():
    backend = MemoryStorageUnit("r0", memory_budget=1 << 20)
    server = StorageUnitServer(backend, shared_memory=False, secret=SECRET).start()
    good = RemoteStorageUnit("r0", server.address, timeout_s=5, secret=SECRET)
    try:
        good.put("k", np.arange(3, dtype=np.int32))
        request = wire.encode({"op": "delete", "id": 7, "keys": ["k"]})
        signed = request + [wire.sign(request, SECRET, nonce=b"n" * 16, seq=5)]
        first = wire.decode_control(wire.verify_mac(_raw(server.address, signed), SECRET)[0])
        assert first["ok"] is True and first["removed"] == 1
        good.put("k", np.arange(3, dtype=np.int32))                      # written again
        again = wire.decode_control(wire.verify_mac(_raw(server.address, signed), SECRET)[0])
        assert again["ok"] is False and "replay" in again["message"]
        assert backend.exists("k")                                        # the replay deleted nothing
        old = request + [wire.sign(request, SECRET, nonce=b"m" * 16, seq=1,
                                   time_ms=int((time.time() - 3600) * 1000))]
        stale = wire.decode_control(wire.verify_mac(_raw(server.address, old), SECRET)[0])
        assert stale["ok"] is False and "replay or a skewed clock" in stale["message"]
        assert backend.exists("k")
    finally:
        good.close()
        server.stop()
        backend.close()


def test_replay_guard_window():
    now = [1000.0]
    g = wire.ReplayGuard(window_s=60, max_senders=2, clock=lambda: now[0])

    def auth(nonce, seq, t=None):
        return wire.Auth(nonce, seq, int((now[0] if t is None else t) * 1000))

    g.check(auth(b"a", 5))
    g.check(auth(b"a", 3))                                      # late but new: accepted
    g.check(auth(b"a", 2000))                                   # jumps ahead
    for seq in (3, 5, 2000, 900):                               # seen, or fell out of the window
        with pytest.raises(ProtocolError):
            g.check(auth(b"a", seq))
    g.check(auth(b"a", 1999))
    with pytest.raises(ProtocolError):
        g.check(auth(b"b", 1, t=now[0] - 61))                   # older than the window
    g.check(auth(b"b", 1))
    g.check(auth(b"c", 1))                                      # a third sender evicts the oldest
    assert len(g._senders) == 2 and g.replayed == 5


def test_a_reply_to_another_request_is_not_taken():
    """A client accepts only the reply that names its own request (nonce and sequence number)."""
    backend = MemoryStorageUnit("s0", memory_budget=1 << 20)
    server = StorageUnitServer(backend, shared_memory=False, secret=SECRET).start()
    a = RemoteStorageUnit("s0", server.address, timeout_s=5, secret=SECRET)
    try:
        a.put("k", np.arange(5, dtype=np.int32))
        frames = wire.encode({"ok": True, "id": 1, "removed": 99})
        forged = frames + [wire.sign(frames, SECRET, nonce=b"z" * 16, seq=1)]
        with pytest.raises(ProtocolError):
            wire.open_frames(forged[:-1] + [forged[-1][:-1] + bytes([forged[-1][-1] ^ 1])], SECRET)  # one tag bit flipped
        body, auth = wire.open_frames(forged, SECRET)
        assert auth.nonce == b"z" * 16 and auth.nonce != a._rpc._nonce
        np.testing.assert_array_equal(a.get("k"), np.arange(5))
    finally:
        a.close()
        server.stop()
        backend.close()


def test_placements_are_bounded_in_total_per_unit_and_stats_keeps_answering(controller):
    from dressage.errors import StorageFullError
    from dressage.tq.directory.controller import MAX_UNIT_DIRECTORY_BYTES

    ctl, server, remote = controller
    placed = 0
    with pytest.raises(StorageFullError, match="directory past"):
        for i in range(MAX_UNIT_DIRECTORY_BYTES // 2**48 + 1):
            remote._rpc.call("place", {"items": [[f"k{i}", 2**48, ""]]})
            placed += 1
    assert placed == MAX_UNIT_DIRECTORY_BYTES // 2**48
    stats = remote.stats()
    assert stats["u0"]["directory_bytes"] == MAX_UNIT_DIRECTORY_BYTES and server.rpc.untyped == 0
