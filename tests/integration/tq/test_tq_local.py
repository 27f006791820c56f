"""``local`` deployment: Controller and StorageUnits as real processes; a dead unit is a typed error."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest

from dressage.errors import KeyNotFoundError, StorageUnitUnavailable
from dressage.tq import FieldRef, TransferQueue
from dressage.tq.directory.entries import KeyState

READER = r"""
import json, sys
import numpy as np
from dressage.tq import FieldRef, TransferQueueClient
msg = json.loads(sys.stdin.read())
client = TransferQueueClient.connect(msg["spec"])
refs = [FieldRef.from_wire(w) for w in msg["refs"]]
arrays = client.get_many(refs, consume=True)
print(json.dumps({"sums": [int(a.astype(np.int64).sum()) for a in arrays],
                  "requests": client.counters.get_requests}))
client.close()
"""


@pytest.fixture(scope="module")
def tq(tmp_path_factory):
    spill = tmp_path_factory.mktemp("spill")
    with TransferQueue.start({"deployment": "local", "num_storage_units": 2, "unit_memory_budget": "1MiB",
                              "spill_dir": str(spill), "request_timeout_s": 10}) as tq:
        yield tq


def test_processes_are_separate_and_put_get_clear_round_trips(tq):
    pids = tq.processes()
    assert set(pids) == {"controller", "unit0", "unit1"}
    assert os.getpid() not in pids.values() and all(psutil.pid_exists(p) for p in pids.values())
    client = tq.client()
    r3 = np.random.default_rng(0).integers(0, 128, size=(500, 4, 8)).astype(np.uint8)
    refs = [client.put("routed_experts", r3 + i, batch="s1") for i in range(4)]
    assert {r.unit_id for r in refs} == {"unit0", "unit1"}
    got = client.get_many([r.narrow(100, 200) for r in refs])
    for i, g in enumerate(got):
        np.testing.assert_array_equal(g, (r3 + i)[100:200])
    assert client.counters.bytes_read == 4 * 100 * 32
    assert client.clear("s1") == 4
    assert tq.total_keys() == 0 and tq.controller.total_keys() == 0


def test_spill_across_the_process_boundary(tq):
    client = tq.client()
    big = np.arange(300_000, dtype=np.int32)  # 1.2 MB > the 1 MiB budget
    ref = client.put("routed_experts", big, batch="spill")
    assert tq.stats()[ref.unit_id]["spilled_bytes"] == big.nbytes
    np.testing.assert_array_equal(client.get(ref.narrow(299_990, 300_000)), big[-10:])
    assert client.clear("spill") == 1
    assert tq.stats()[ref.unit_id]["spilled_bytes"] == 0


def test_reader_in_another_process_connects_from_the_client_spec(tq):
    client = tq.client()
    arrays = [np.full((64, 2), i, dtype=np.int32) for i in range(5)]
    refs = [client.put("routed_experts", a, batch="remote") for a in arrays]
    msg = {"spec": tq.client_spec(), "refs": [r.narrow(0, 10).to_wire() for r in refs]}
    out = subprocess.run([sys.executable, "-c", READER], input=json.dumps(msg), capture_output=True,
                         text=True, timeout=60, check=True)
    result = json.loads(out.stdout)
    assert result["sums"] == [i * 20 for i in range(5)]
    assert result["requests"] == 2  # one round trip per unit
    assert client.clear("remote") == 5 and tq.total_keys() == 0


def test_dead_unit_is_a_bounded_typed_error_naming_unit_and_keys():
    with TransferQueue.start({"deployment": "local", "num_storage_units": 2, "request_timeout_s": 1.0,
                              "unit_memory_budget": "1MiB"}) as tq:
        client = tq.client()
        tokens = [u["shm_token"] for u in tq.client_spec()["units"]]
        big = [client.put("routed_experts", np.ones(300_000, dtype=np.uint8)) for _ in range(2)]
        assert {r.unit_id for r in big} == {"unit0", "unit1"}  # one shared-memory segment in each
        # (``-z`` names are a unit's free pool and its index)
        assert sum(len(glob.glob(f"/dev/shm/dtq-{t}-[!z]*")) for t in tokens) == 2
        refs = [client.put("logprobs", np.full(16, i, dtype=np.float32)) for i in range(4)]
        victim = refs[0].unit_id
        os.kill(tq.processes()[victim], signal.SIGKILL)
        dead = [r for r in refs if r.unit_id == victim]
        alive = [r for r in refs if r.unit_id != victim]
        with pytest.raises(StorageUnitUnavailable) as info:
            client.get_many(refs)
        # Bounded: the read failed on the refused connection or the unit's known death, not by waiting
        # out the 1 s request timeout.
        assert "no reply within" not in str(info.value) and "timed out" not in str(info.value)
        assert victim in str(info.value) and dead[0].key in str(info.value)
        # The surviving unit keeps serving, and every new put goes to it.
        np.testing.assert_array_equal(client.get_many(alive)[0], np.full(16, int(client.get(alive[0])[0])))
        # The read failed at once (the unit's stream socket refused the connection); the Controller's
        # watch on the unit's process marks it dead on its own, within a fraction of a second.
        deadline = time.monotonic() + 5
        while tq.unit_states()[victim]["state"] != "dead" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tq.unit_states()[victim]["state"] == "dead"
        before = tq.controller.total_keys()
        later = [client.put("logprobs", np.zeros(16, dtype=np.float32)) for _ in range(4)]
        assert all(r.unit_id != victim for r in later)
        assert tq.controller.total_keys() == before + 4
        stats = tq.stats()
        assert stats[victim]["available"] is False and victim in stats[victim]["error"]
        assert stats[victim]["state"] == "dead" and "exited" in stats[victim]["state_reason"]
        with pytest.raises(StorageUnitUnavailable):
            tq.total_keys()
        with pytest.raises(KeyNotFoundError):
            client.get(FieldRef(key="gone", unit_id=alive[0].unit_id, field="logprobs", dtype="float32",
                                shape=(16,)))
        pids = tq.processes()
    assert all(glob.glob(f"/dev/shm/dtq-{t}-*") == [] for t in tokens)  # even the killed unit's segment
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids.values())


def test_retention_runs_in_the_controller_process_and_empties_the_units():
    with TransferQueue.start({"deployment": "local", "num_storage_units": 2, "retention_s": 0.3,
                              "unit_memory_budget": "1MiB"}) as tq:
        client = tq.client()
        for i in range(6):
            client.put("logprobs", np.full(64, i, dtype=np.float32), batch="never-cleared")
        assert tq.total_keys() == 6
        deadline = time.monotonic() + 10
        while tq.total_keys() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert tq.total_keys() == 0 and tq.controller.total_keys() == 0


def test_a_generated_secret_keeps_local_peers_without_it_out(tq):
    import stat

    from dressage.errors import ProtocolError
    from dressage.tq.directory.entries import UnitInfo
    from dressage.tq.directory.service import RemoteController
    from dressage.tq.storage.remote import RemoteStorageUnit

    spec = tq.client_spec()
    path = tq.secret_file
    assert path is not None and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == spec["auth_secret"] and len(spec["auth_secret"]) >= 32
    client = tq.client()
    ref = client.put("logprobs", np.arange(10, dtype=np.float32))
    intruder = RemoteController(spec["controller"], timeout_s=5)
    unit = RemoteStorageUnit("unit0", spec["units"][0]["address"], timeout_s=5)
    try:
        for attempt in (lambda: intruder.mark_unit_dead("unit0", "forged"),
                        lambda: intruder.add_unit(UnitInfo("evil", memory_budget=1 << 40, address="tcp://1.2.3.4:1")),
                        lambda: intruder.delete([ref.key]),
                        lambda: unit.delete([ref.key])):
            with pytest.raises(ProtocolError, match="unauthenticated"):
                attempt()
    finally:
        intruder.close()
        unit.close()
    assert {u.unit_id for u in tq.units()} == {"unit0", "unit1"}
    assert all(s["state"] == "live" for s in tq.controller.unit_states().values())
    np.testing.assert_array_equal(client.get(ref), np.arange(10, dtype=np.float32))
    client.delete([ref])


def test_an_embedded_deployment_served_over_zmq_authenticates_and_removes_its_secret():
    with TransferQueue.start({"retention_s": None}) as tq:
        spec = tq.client_spec()
        path = tq.secret_file
        assert spec["auth_secret"] and path.read_text() == spec["auth_secret"]
    assert not path.exists() and not path.parent.exists()



def test_shutdown_stops_the_controller_before_any_unit(monkeypatch):
    # A Controller still running while its units exit has its janitor's deletes fail against them, each
    # logged as a warning on an ordinary shutdown: it gets SIGTERM, and is gone, before the units get theirs.
    from dressage.tq.deploy import local

    real, calls = local.stop_children, []

    def recording(procs, grace_s=5.0):
        calls.append(({p.pid for p in procs}, {pid for pid, p in everyone.items() if p.poll() is None}))
        real(procs, grace_s)

    tq = TransferQueue.start({"deployment": "local", "num_storage_units": 2})
    everyone = {p.pid: p for p in tq._deployment._procs.values()}
    pids = tq._deployment.processes()
    controller, units = {pids.pop("controller")}, set(pids.values())
    monkeypatch.setattr(local, "stop_children", recording)
    tq.shutdown()
    assert [stopped for stopped, _ in calls] == [controller, units]
    assert calls[0][1] == controller | units and calls[1][1] == units  # the units ran until the Controller was gone
    assert all(p.poll() is not None for p in everyone.values())


def test_a_clear_across_processes_leaves_its_deletions_off_the_janitors_queue():
    # The client deletes the unit copies itself and tells the Controller process (one-way): its queue
    # empties at once, not at the janitor's next sweep (every 5 s at this retention), which would delete
    # every key a second time.
    with TransferQueue.start({"deployment": "local", "num_storage_units": 2, "retention_s": 3600}) as tq:
        client = tq.client()
        refs = [client.put("logprobs", np.full(64, i, np.float32), batch="b") for i in range(8)]
        # A leased put's commit rides on the next message; one landing after the clear would queue its
        # unit copy for deletion again (by design): every commit lands first.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(tq.controller.state(r.key) != KeyState.WRITTEN for r in refs):
            time.sleep(0.01)
        assert client.clear("b") == 8
        deadline = time.monotonic() + 2.5  # the janitor's first sweep comes 5 s after the start
        while time.monotonic() < deadline and any(s["queued_deletes"] for s in tq.controller.stats().values()):
            time.sleep(0.01)
        assert {u: s["queued_deletes"] for u, s in tq.controller.stats().items()} == {u: 0 for u in tq.storage_units()}
        assert all(not u.exists(r.key) for u in tq.storage_units().values() for r in refs)


def test_a_leased_put_outlasting_a_stalled_controller_succeeds_once_it_resumes_and_records_once():
    # The Controller stalls (SIGSTOP) while a leased put's placement is on its stream: the stream's reply
    # does not come in time, so the placement is sent again on ZMQ. When the Controller resumes it applies
    # both copies: the second, carrying the same placement id, is answered as the first, not refused as
    # write-once (which failed the put and left its key pending and its payload on the unit).
    with TransferQueue.start({"deployment": "local", "num_storage_units": 2, "request_timeout_s": 4,
                              "unit_dead_after_s": 30, "shared_memory": False, "retention_s": None}) as tq:
        client = tq.client()
        client.put("logprobs", np.ones(1024, np.float32), batch="b")  # a lease, and the stream learnt
        assert client._fast_write.granted == 1
        data = np.arange(8 << 20, dtype=np.uint8)
        pid = tq.processes()["controller"]
        os.kill(pid, signal.SIGSTOP)
        got: dict = {}

        def put():
            try:
                got["ref"] = client.put("routed_experts", data, batch="b")
            except Exception as exc:  # noqa: BLE001 - reported below
                got["error"] = exc

        writer = threading.Thread(target=put)
        writer.start()
        time.sleep(5.0)  # past the stream's timeout (4 s), within the ZMQ resend's (3 s to spare)
        os.kill(pid, signal.SIGCONT)
        writer.join(30)
        assert "error" not in got, got.get("error")
        np.testing.assert_array_equal(client.get(got["ref"]), data)
        stats = tq.controller.stats()
        assert sum(s["directory_keys"] for s in stats.values()) == 2
        assert client.clear("b") == 2
        tq.run_janitor()
        assert tq.total_keys() == 0 and all(not u.list() for u in tq.storage_units().values())
