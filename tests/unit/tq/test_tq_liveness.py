"""Unit liveness: the Controller places only on live units, probes find silent ones, clients fail fast."""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest

from dressage.errors import StorageUnitUnavailable
from dressage.tq.client.client import TransferQueueClient
from dressage.tq.directory.controller import Controller
from dressage.tq.directory.entries import UnitInfo
from dressage.tq.directory.liveness import LivenessMonitor
from dressage.tq.directory.service import ControllerServer, RemoteController
from dressage.tq.storage import MemoryStorageUnit
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.storage.server import StorageUnitServer


def test_dead_units_get_no_keys_and_come_back_when_marked_live():
    ctl = Controller([UnitInfo("u0"), UnitInfo("u1")])
    assert ctl.mark_unit_dead("u0", "process 1 exited") is True
    assert ctl.mark_unit_dead("u0", "again") is False
    assert {ctl.place(f"k{i}", 10) for i in range(6)} == {"u1"}
    ctl.mark_unit_dead("u1", "stopped answering")
    with pytest.raises(StorageUnitUnavailable, match="no live StorageUnit.*u0 dead.*u1 dead"):
        ctl.place("k-none", 10)
    assert ctl.mark_unit_live("u0") is True
    assert ctl.place("k-back", 10) == "u0"
    states = ctl.unit_states()
    assert states["u0"]["state"] == "live" and states["u1"]["state"] == "dead"
    assert ctl.stats()["u1"]["state"] == "dead" and "stopped answering" in ctl.stats()["u1"]["state_reason"]


def test_deletions_for_a_dead_unit_wait_until_it_answers_again():
    ctl = Controller([UnitInfo("u0")])
    ctl.place("k", 10)
    ctl.commit("k")
    ctl.mark_unit_dead("u0", "stopped")
    assert ctl.delete(["k"]) == {"u0": ["k"]}
    assert ctl.take_deletions() == {}          # a delete on a dead unit would only time out
    ctl.mark_unit_live("u0")
    assert ctl.take_deletions() == {"u0": ["k"]}


class _FlakyUnit:
    """A probe target that answers until ``silent`` is set (a stopped process), then times out."""

    def __init__(self) -> None:
        self.silent = threading.Event()
        self.missed = 0

    def ping(self, timeout_s: float | None = None) -> None:
        if self.silent.is_set():
            self.missed += 1
            time.sleep(min(timeout_s or 0.0, 0.05))
            raise StorageUnitUnavailable("StorageUnit u0 is unavailable (ping: no reply)")


def _wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def test_monitor_marks_a_silent_unit_dead_within_the_bound_and_live_when_it_answers():
    ctl = Controller([UnitInfo("u0"), UnitInfo("u1")])
    flaky, steady = _FlakyUnit(), _FlakyUnit()
    monitor = LivenessMonitor(ctl, {"u0": flaky, "u1": steady}, interval_s=0.05, dead_after_s=0.3).start()
    try:
        time.sleep(0.15)
        assert ctl.unit_states()["u0"]["state"] == "live"
        flaky.silent.set()
        _wait_for(lambda: ctl.unit_states()["u0"]["state"] == "dead")
        # dead_after_s spans several probe periods: one missed probe is not yet a verdict.
        assert flaky.missed >= 2 and steady.missed == 0
        assert "answered no probe" in ctl.unit_states()["u0"]["reason"]
        assert ctl.unit_states()["u1"]["state"] == "live"
        flaky.silent.clear()
        _wait_for(lambda: ctl.unit_states()["u0"]["state"] == "live", 2.0)
    finally:
        monitor.stop()


@contextlib.contextmanager
def _served_unit(*, timeout_s: float, **client_kw):
    """A StorageUnit served on ZMQ, its in-process Controller and a client; ``hung`` (set at the end)
    is what a test's blocking backend method waits on, so the unit stalls with its socket open."""
    backend = MemoryStorageUnit("u0", memory_budget=1 << 20)
    server = StorageUnitServer(backend, shared_memory=False).start()
    ctl = Controller([UnitInfo("u0")])
    remote = RemoteStorageUnit("u0", server.address, timeout_s=timeout_s)
    client = TransferQueueClient(ctl, {"u0": remote}, **client_kw)
    hung = threading.Event()
    try:
        yield ctl, backend, client, hung
    finally:
        hung.set()
        server.stop()
        client.close()
        remote.close()
        backend.close()


def test_a_read_waiting_on_a_unit_ends_when_the_unit_is_marked_dead():
    """The unit is alive at the socket level but never answers; the Controller's verdict ends the wait."""
    with _served_unit(timeout_s=30) as (ctl, backend, client, hung):
        ref = client.put("logprobs", np.arange(8, dtype=np.float32))
        real_get = backend.get_many
        # The unit takes the read and never answers (its socket stays open); timeout is 30 s. (A stopped
        # server would not do: the client may see its connection close and fail at once, verdict or not.)
        backend.get_many = lambda *a, **k: (hung.wait(60), real_get(*a, **k))[1]
        threading.Timer(0.3, ctl.mark_unit_dead, args=("u0", "test verdict")).start()
        with pytest.raises(StorageUnitUnavailable) as info:
            client.get(ref)
        # The verdict ended the wait: a time-out would say "no reply within 30 s".
        assert "u0" in str(info.value) and ref.key in str(info.value) and "test verdict" in str(info.value)
        assert "no reply within" not in str(info.value)
        with pytest.raises(StorageUnitUnavailable, match="marked dead") as info:   # known dead: refused
            client.get(ref)                                                        # before any send
        assert "no reply within" not in str(info.value)
        assert client.dead_units() == {"u0": client.dead_units()["u0"]}
        assert client.delete([ref]) == 1                # the unit copy stays queued, nothing waits


def test_a_put_whose_unit_goes_silent_is_placed_again_on_a_live_unit():
    backends = {u: MemoryStorageUnit(u, memory_budget=1 << 20) for u in ("u0", "u1")}
    servers = {u: StorageUnitServer(b, shared_memory=False).start() for u, b in backends.items()}
    ctl = Controller([UnitInfo("u0"), UnitInfo("u1")])
    remotes = {u: RemoteStorageUnit(u, s.address, timeout_s=30) for u, s in servers.items()}
    client = TransferQueueClient(ctl, remotes)
    try:
        servers["u0"].stop()
        threading.Timer(0.3, ctl.mark_unit_dead, args=("u0", "silent")).start()
        refs = [client.put("logprobs", np.full(4, i, dtype=np.float32)) for i in range(4)]
        assert {r.unit_id for r in refs} == {"u1"}
        assert [int(a[0]) for a in client.get_many(refs)] == [0, 1, 2, 3]
        assert ctl.total_keys() == 4                    # the failed attempt left no directory entry
    finally:
        client.close()
        for r in remotes.values():
            r.close()
        servers["u1"].stop()


def test_monitor_survives_unexpected_errors():
    ctl = Controller([UnitInfo("u0")])

    class Broken:
        def ping(self, timeout_s=None):
            raise RuntimeError("bug")

    monitor = LivenessMonitor(ctl, {"u0": Broken()}, interval_s=0.02, dead_after_s=0.05).start()
    try:
        _wait_for(lambda: monitor.probes >= 3)
        assert ctl.unit_states()["u0"]["state"] == "live"  # a probe bug is not a death verdict
    finally:
        monitor.stop()


def test_dead_reason_is_what_in_process_handles_check():
    ctl = Controller([UnitInfo("u0")])
    assert ctl.dead_reason("u0") is None and ctl.dead_reason("nope") is None
    ctl.mark_unit_dead("u0", "process 7 exited with code -9")
    assert "process 7 exited" in ctl.dead_reason("u0")


def test_a_unit_busy_with_a_long_request_is_not_marked_dead():
    class Slow(MemoryStorageUnit):
        def get_many(self, requests):
            time.sleep(1.2)                              # a multi-GiB read on a loaded host
            return super().get_many(requests)

    backend = Slow("u0", memory_budget=1 << 20)
    server = StorageUnitServer(backend, shared_memory=False).start()
    ctl = Controller([UnitInfo("u0")])
    data = RemoteStorageUnit("u0", server.address, timeout_s=10)
    probe = RemoteStorageUnit("u0", server.heartbeat.address, timeout_s=0.4)
    monitor = LivenessMonitor(ctl, {"u0": probe}, interval_s=0.05, dead_after_s=0.4).start()
    try:
        data.put("k", np.arange(3, dtype=np.int32))
        np.testing.assert_array_equal(data.get("k"), [0, 1, 2])  # the main loop was busy for 1.2 s
        assert ctl.unit_states()["u0"]["state"] == "live" and monitor.probes > 5
    finally:
        monitor.stop()
        probe.close()
        data.close()
        server.stop()


def test_reads_of_live_units_do_not_wait_on_a_stalled_controller():
    """Reads go straight to the unit; the liveness check asks a stalled Controller briefly, then backs off
    and keeps the last known states, which come back up to date once the Controller answers again."""
    ctl = Controller([UnitInfo("u0")])
    stalled = threading.Event()
    resumed = threading.Event()
    real_states = ctl.unit_states

    def unit_states():
        if stalled.is_set():           # the Controller's one loop stops serving (a SIGSTOPped process)
            resumed.wait(30)
        return real_states()

    ctl.unit_states = unit_states
    ctl_server = ControllerServer(ctl, stream=False).start()
    backend = MemoryStorageUnit("u0", memory_budget=1 << 20)
    server = StorageUnitServer(backend, shared_memory=False).start()
    remote_ctl = RemoteController(ctl_server.address, timeout_s=2.0)
    remote = RemoteStorageUnit("u0", server.address, timeout_s=2.0)
    client = TransferQueueClient(remote_ctl, {"u0": remote}, fast_writes=False)
    try:
        refs = [client.put("logprobs", np.full(4, i, dtype=np.float32)) for i in range(3)]
        client.get(refs[0])
        stalled.set()
        time.sleep(0.25)                                   # the view's copy is stale: the next check asks
        t0 = time.monotonic()
        first = client.get(refs[1])
        took_first = time.monotonic() - t0
        t0 = time.monotonic()
        rest = client.get_many(refs)
        took_rest = time.monotonic() - t0
        # Before: each check waited out the 2 s request timeout, twice per unit read (4 s, then 4 s).
        assert [float(first[0])] + [float(a[0]) for a in rest] == [1.0, 0.0, 1.0, 2.0]
        assert took_first < 0.8 and took_rest < 0.3, (took_first, took_rest)
        assert client._liveness.failed_refreshes == 1      # backed off: asked once, not per check
        ctl.mark_unit_dead("u0", "verdict while stalled")  # the stalled Controller cannot tell anyone yet
        assert client.dead_units() == {}                   # the last known states stay
        resumed.set()
        stalled.clear()
        deadline = time.monotonic() + 3.0                  # asked again once the backoff (1 s) is over
        while not client.dead_units() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "verdict while stalled" in client.dead_units()["u0"]
    finally:
        resumed.set()
        client.close()
        remote.close()
        remote_ctl.close()
        server.stop()
        ctl_server.stop()
        backend.close()


def test_delete_and_clear_leave_a_stalled_units_deletions_to_the_janitor():
    """The unit takes the delete and never answers (stalled, not yet marked dead): the directory already
    forgot the keys and queued the unit deletions, so the release counts them and returns, no error."""
    with _served_unit(timeout_s=0.5, fast_writes=False) as (ctl, backend, client, hung):
        refs = [client.put("logprobs", np.full(4, i, dtype=np.float32)) for i in range(3)]
        batch = [client.put("logprobs", np.full(4, 9, dtype=np.float32), batch="b1") for _ in range(2)]
        real_delete = backend.delete
        backend.delete = lambda *a, **k: (hung.wait(30), real_delete(*a, **k))[1]
        assert client.delete(refs[:2]) == 2              # before: StorageUnitUnavailable (no reply in 0.5 s)
        assert client.clear("b1") == 2
        assert client.clear("b1") == 0                   # the directory was cleared the first time
        assert client.counters.deletes == 4 and client.counters.deletes_deferred == 4
        assert ctl.total_keys() == 1
        assert sorted(ctl.take_deletions()["u0"]) == sorted(r.key for r in refs[:2] + batch)  # the janitor's
        hung.set()
        backend.delete = real_delete
        assert client.delete([refs[2]]) == 1             # a unit that answers deletes at once, as before
        assert client.counters.deletes_deferred == 4 and ctl.total_keys() == 0
