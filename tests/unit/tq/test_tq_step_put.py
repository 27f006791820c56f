"""A step's put on one host: its small fields in the large field's segment, rows verified by their reader,
and the leased placement on the Controller's stream socket. What is stored, and what is refused."""

from __future__ import annotations

import glob
import os
import signal
import time

import numpy as np
import pytest

from dressage.errors import IntegrityError, ProtocolError, StorageFullError, StorageUnitUnavailable
from dressage.tq import TransferQueue, TransferQueueClient
from dressage.tq.transport import shm
from dressage.tq.transport.bulk import StreamBroken
from dressage.tq.transport.bulk_rpc import BulkClient
from dressage.tq.directory.controller import Controller
from dressage.tq.directory.entries import KeyState, UnitInfo
from dressage.tq.directory.service import ControllerServer, RemoteController
from dressage.tq.storage.remote import _checked_span

pytestmark = pytest.mark.skipif(shm.host_id() is None, reason="no /dev/shm on this host")
SECRET = b"s" * 32
R3 = (4096, 40, 8)  # one step's routed experts: 1.25 MiB of uint8, in a 2 MiB segment
MiB = 1 << 20


def segments(token):
    """Segments in use (the free pool's ``-z`` files excluded)."""
    return [p for p in glob.glob(os.path.join(shm.SHM_DIR, f"dtq-{token}-*"))
            if not os.path.basename(p).startswith(f"dtq-{token}-z")]


def _step(seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 255, size=R3, dtype=np.uint8), rng.standard_normal(4096).astype(np.float32)


def _flip(path, offset):
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([byte[0] ^ 0xFF]), offset)
    finally:
        os.close(fd)


# -- the small fields of a step in its large field's segment ----------------------------------------------


def test_pack_offsets_fit_the_tail_of_the_first_fields_class():
    r3 = int(np.prod(R3))
    assert shm.pack_offsets(r3, [16384, 4]) == [r3, r3 + 16384]
    assert shm.pack_offsets(2 * MiB - 100, [64, 65]) == [2 * MiB - 64, None]  # the second would need a larger file
    assert shm.pack_offsets(1000, [0, 8]) == [None, 1024]  # an empty field is never a segment part
    assert all(o is None or o % shm.PART_ALIGN == 0 for o in shm.pack_offsets(1001, [3, 5, 7]))


def test_a_steps_fields_share_one_segment_and_it_is_released_with_the_last(served):
    backend, server, remote = served
    r3, lp = _step()
    stream_before = server.bulk.served
    remote.put_many([("r3", r3), ("lp", lp), ("tiny", np.arange(3, dtype=np.int64))])
    assert server.bulk.served == stream_before + 1 and len(segments(server.shm.token)) == 1
    assert not backend._unsealed  # the writer hashed every field: the unit read none of them
    out = remote.get_many([("lp", 0, None), ("r3", 10, 20), ("tiny", 1, 3)])
    np.testing.assert_array_equal(out[0], lp)
    np.testing.assert_array_equal(out[1], r3[10:20])
    np.testing.assert_array_equal(out[2], [1, 2])
    del out
    remote.delete(["r3"])
    np.testing.assert_array_equal(remote.get("lp"), lp)  # still mapped: the segment lives on
    assert len(segments(server.shm.token)) == 1
    remote.delete(["lp", "tiny"])
    assert segments(server.shm.token) == []  # the last one gone: back to the free pool


def test_a_tampered_small_field_is_an_integrity_error_at_its_reader_and_the_rest_reads(served):
    _, server, remote = served
    r3, lp = _step(1)
    remote.put_many([("r3", r3), ("lp", lp)])
    _flip(segments(server.shm.token)[0], r3.nbytes + 40)  # a byte of the logprobs, after the put
    with pytest.raises(IntegrityError, match="'lp'"):
        remote.get("lp", 5, 6)
    np.testing.assert_array_equal(remote.get("r3"), r3)
    _flip(segments(server.shm.token)[0], 100)  # and one of the routed experts
    with pytest.raises(IntegrityError, match=r"'r3'.*rows \[0, "):
        remote.get("r3", 3, 4)
    np.testing.assert_array_equal(remote.get("r3", 4000, 4096), r3[4000:])  # other blocks stay readable


def test_a_full_unit_refuses_a_packed_put_and_keeps_nothing(served):
    backend, server, remote = served
    remote.put_many([(f"f{i}", _step(i)[0]) for i in range(6)])  # 7.5 of 8 MiB
    r3, lp = _step(9)
    with pytest.raises(StorageFullError):
        remote.put_many([("over", r3), ("over-lp", lp)])
    assert not backend.exists("over") and not backend.exists("over-lp")
    assert len(segments(server.shm.token)) == 6  # the refused one went back to the free pool


def test_a_unit_that_dies_mid_put_stores_nothing_and_the_writer_removes_the_shared_segment(served):
    backend, server, remote = served

    def dies(control, frames, tags=None):
        raise StreamBroken("the unit died")

    server.bulk._handler = dies
    with pytest.raises(StorageUnitUnavailable, match="bulk"):
        remote.put_many([("lost", _step()[0]), ("lost-lp", _step()[1])])
    assert not backend.exists("lost") and not backend.exists("lost-lp") and segments(server.shm.token) == []


def test_a_packed_put_with_the_wrong_secret_is_refused_and_leaves_no_segment(served, intruder):
    backend, server, remote = served
    with pytest.raises(ProtocolError):
        intruder.put_many([("evil", _step()[0]), ("evil-lp", _step()[1])])
    assert not backend.exists("evil-lp") and segments(server.shm.token) == []


@pytest.mark.parametrize("parts", [
    [0, 100],              # overlapping
    [0, 1310720 + 2],      # not a multiple of the float32 itemsize
    [64, 1310720 + 64],    # the first part not at 0
])
def test_segment_parts_that_overlap_or_do_not_align_are_refused_and_nothing_is_stored(served, parts):
    backend, server, remote = served
    r3, lp = _step(3)
    name = f"dtq-{server.shm.token}-p0"
    shm.write_segment_parts(name, [(0, r3), (1310720 + 64, lp)], server.shm.token)
    bulk = remote._bulk_client(["a"])
    with pytest.raises(ProtocolError, match="parts"):
        bulk.call("put", {"items": [["a", "uint8", list(R3), name, None, parts[0]],
                                    ["b", "float32", [4096], name, None, parts[1]]]}, keys=["a", "b"])
    assert not backend.exists("a") and not backend.exists("b") and segments(server.shm.token) == []


def test_a_get_reply_with_a_block_span_that_does_not_fit_is_refused():
    good = [0, 4096, 4096, 0, bytes(8)]
    assert _checked_span(good, np.dtype(np.float32), (4096,))[1] == 4096
    for bad in ([0, 4096, 4096, 0, bytes(16)], [5, 4096, 4096, 0, bytes(8)], [-1, 4096, 4096, 0, bytes(8)],
                [0, 4096, 0, 0, bytes(8)], [0, 4096, 4096, 0, "x"], "junk"):
        with pytest.raises(ProtocolError):
            _checked_span(bad, np.dtype(np.float32), (4096,))


# -- leased placements on the Controller's stream socket ------------------------------------------------


@pytest.fixture
def directory():
    controller = Controller([UnitInfo("u", None, 64 * MiB)])
    server = ControllerServer(controller, secret=SECRET).start()
    remote = RemoteController(server.address, timeout_s=5, secret=SECRET)
    yield controller, server, remote
    remote.close()
    server.stop()


def test_leased_placements_take_the_controllers_stream_socket(directory):
    controller, server, remote = directory
    grant = remote.lease(1000)
    assert remote._stream is not None and remote._stream.port == server.stream_port
    zmq_before = server.rpc.served
    remote.place_leased(grant["lease"], "u", [("k", 10, "f")])
    assert server.stream.served == 1 and server.rpc.served == zmq_before
    assert controller.state("k") is KeyState.PENDING
    with pytest.raises(Exception, match="write-once"):  # the directory's rules are the same on the stream
        remote.place_leased(grant["lease"], "u", [("k", 10, "f")])


def test_the_controllers_stream_refuses_a_wrong_secret_and_payloads(directory):
    controller, server, _ = directory
    intruder = BulkClient("127.0.0.1", server.stream_port, timeout_s=5, name="intruder", secret=b"w" * 32)
    try:
        with pytest.raises(ProtocolError):
            intruder.call("place", {"items": [["evil", 10, "f"]]})
    finally:
        intruder.close()
    assert server.stream.rejected == 1 and controller.state("evil") is None
    friend = BulkClient("127.0.0.1", server.stream_port, timeout_s=5, name="friend", secret=SECRET)
    try:
        with pytest.raises((ProtocolError, StorageUnitUnavailable)):
            friend.call("place", {"items": [["pay", 10, "f"]]}, [np.ones(8, np.uint8)])
        assert controller.state("pay") is None
        # The refusal closed that connection and said so: the client's next call opens a new one.
        assert friend.call("ping")[0]["stream_port"] == server.stream_port
    finally:
        friend.close()
    again = BulkClient("127.0.0.1", server.stream_port, timeout_s=5, name="again", secret=SECRET)
    try:
        assert again.call("ping")[0]["stream_port"] == server.stream_port  # and it keeps serving
    finally:
        again.close()


def test_a_placement_stream_that_breaks_mid_put_places_the_put_the_regular_way():
    with TransferQueue.start({"unit_memory_budget": "64MiB", "request_timeout_s": 5, "on_full": "error"}) as tq:
        client = TransferQueueClient.connect(tq.client_spec())
        try:
            client.put("logprobs", np.ones(8, np.float32))  # the lease (and the stream port) first
            assert client._controller._stream is not None
            server = next(s for s in tq._deployment.servers.servers if isinstance(s, ControllerServer))

            def dies(control, frames):
                raise StreamBroken("the controller died")

            server.stream._handler = dies
            ref = client.put("logprobs", np.full(8, 7, np.float32), batch="b")
            assert tq.controller.where([ref.key]) == {ref.key: ref.unit_id}  # recorded once, on ZMQ
            np.testing.assert_array_equal(client.get(ref), np.full(8, 7, np.float32))
        finally:
            client.close()


def test_a_controller_killed_mid_run_ends_the_next_put_within_the_request_timeout_and_loses_no_put():
    config = {"deployment": "local", "unit_memory_budget": "64MiB", "request_timeout_s": 2, "on_full": "error",
              "shared_memory": True}
    with TransferQueue.start(config) as tq:
        client = TransferQueueClient.connect(tq.client_spec())
        try:
            r3, lp = _step()
            first = client.put_many([("routed_experts", r3), ("logprobs", lp)])
            os.kill(tq.processes()["controller"], signal.SIGKILL)
            time.sleep(0.2)
            # The Controller is started again: the put in its way is either taken by the new one (its
            # placement claims the key the new one adopted from the unit) or ends by the request timeout,
            # never in a hang or a write-once conflict.
            try:
                second = client.put_many([("routed_experts", r3), ("logprobs", lp)])
            except StorageUnitUnavailable as exc:
                assert "no reply within 2 s" in str(exc)
                second = []
            deadline = time.monotonic() + 30
            while tq._deployment.controller_restarts < 1:
                assert time.monotonic() < deadline, "the Controller was not started again"
                time.sleep(0.05)
            third = client.put_many([("routed_experts", r3), ("logprobs", lp)])
            for refs in (first, second, third):
                if refs:
                    got = client.get_many(refs, copy=True)
                    np.testing.assert_array_equal(got[0], r3)
                    np.testing.assert_array_equal(got[1], lp)
            assert tq.total_keys() >= len(first) + len(second) + len(third)
        finally:
            client.close()


def test_only_a_reader_that_verifies_gets_digests_instead_of_rows_the_unit_checked(served):
    _, server, remote = served
    r3, lp = _step(4)
    remote.put_many([("r3", r3), ("lp", lp)])
    bulk = remote._bulk_client(["r3"])
    reply, _ = bulk.call("get", {"reqs": [["r3", 0, None]], "shm": True, "verify": True})
    assert len(reply["arrays"][0]) == 5 and reply["arrays"][0][4][2] > 0  # digests of the blocks to check
    reply, _ = bulk.call("get", {"reqs": [["r3", 0, None]], "shm": True})
    assert len(reply["arrays"][0]) == 4  # a name only: the unit verified the rows before sending it
    _flip(segments(server.shm.token)[0], 100)
    with pytest.raises(IntegrityError, match="'r3'"):  # refused by the unit itself
        bulk.call("get", {"reqs": [["r3", 0, 10]], "shm": True})
