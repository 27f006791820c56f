"""A Controller started again over running StorageUnits rebuilds its directory from their contents:
no committed key is lost when the Controller process dies."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from dressage.errors import StorageUnitUnavailable
from dressage.tq import TransferQueue
from dressage.tq.directory.controller import Controller
from dressage.tq.directory.entries import KeyState, UnitInfo
from dressage.tq.directory.janitor import Janitor
from dressage.tq.directory.liveness import LivenessMonitor
from dressage.tq.directory.recovery import LateAdoption, recover_directory
from dressage.tq.storage import MemoryStorageUnit

MiB = 1 << 20


class _Down:
    def inventory(self):
        raise StorageUnitUnavailable("unit u2 at tcp://127.0.0.1:9 is unavailable (inventory: no reply)")


def test_recovery_adopts_every_key_each_unit_holds_and_names_the_units_it_could_not_ask():
    units = {u: MemoryStorageUnit(u, memory_budget=64 * MiB) for u in ("u0", "u1")}
    units["u0"].put("a", np.arange(10, dtype=np.float32))
    units["u0"].put("b", np.arange(6, dtype=np.int64))
    units["u1"].put("c", np.zeros((4, 3), dtype=np.uint8))
    ctl = Controller([UnitInfo(u, memory_budget=64 * MiB) for u in ("u0", "u1", "u2")])
    ctl.place_many([("b", 48, "logprobs")])  # known already (placed on whichever unit): left as it is
    known = ctl.where(["b"])["b"]
    report = recover_directory(ctl, {**units, "u2": _Down()})
    assert report.adopted == {"u0": 1, "u1": 1} and list(report.unreachable) == ["u2"]
    assert "no reply" in report.describe()
    assert ctl.where(["a", "b", "c"]) == {"a": "u0", "b": known, "c": "u1"}
    assert ctl.state("a") is KeyState.WRITTEN and ctl.state("c") is KeyState.WRITTEN
    stats = ctl.stats()
    assert stats["u0"]["directory_bytes"] == 40 + (48 if known == "u0" else 0)
    assert stats["u1"]["directory_bytes"] == 12 + (48 if known == "u1" else 0)
    # Adopted keys stay write-once.
    try:
        ctl.place_many([("a", 40, "logprobs")])
        raise AssertionError("a recovered key was placed again")
    except Exception as exc:
        assert "write-once" in str(exc)


class _Stopped:
    """A unit whose process is stopped (SIGSTOP): it answers nothing, neither inventory nor probe, until resumed."""

    def __init__(self, unit):
        self.unit, self.stopped = unit, True

    def _answer(self):
        if self.stopped:
            raise StorageUnitUnavailable(f"unit {self.unit.unit_id} is unavailable (no reply)")

    def inventory(self):
        self._answer()
        return self.unit.inventory()

    def ping(self, timeout_s=None):
        self._answer()

    def close(self):
        pass


def test_a_unit_stopped_during_recovery_keeps_its_keys_and_they_are_adopted_when_it_answers_a_probe():
    now = [0.0]
    units = {u: MemoryStorageUnit(u, memory_budget=64 * MiB) for u in ("u0", "u1")}
    arrays = {f"k{i}": np.full(10 + i, i, dtype=np.float32) for i in range(6)}
    for i, (key, a) in enumerate(arrays.items()):
        units[f"u{i % 2}"].put(key, a)
    ctl = Controller([UnitInfo(u, memory_budget=64 * MiB) for u in units])
    stopped = _Stopped(units["u1"])
    report = recover_directory(ctl, {"u0": units["u0"], "u1": stopped})
    assert report.adopted == {"u0": 3} and list(report.unreachable) == ["u1"]
    # The unit answers the Janitor's listing (it resumed between probes) before any probe adopted it:
    # its committed keys are not orphans, however many rounds pass.
    janitor = Janitor(ctl, units.get, interval_s=1.0, reconcile_s=10.0, clock=lambda: now[0])
    for now[0] in (10.0, 20.0, 30.0):
        assert janitor.run_once() == 0
    assert sorted(units["u1"].list()) == ["k1", "k3", "k5"] and janitor.orphans_removed == 0
    assert ctl.awaits_inventory("u1") and ctl.total_keys() == 3
    late = LateAdoption(ctl, {"u1": stopped})
    monitor = LivenessMonitor(late, {"u1": stopped}, interval_s=0.02, dead_after_s=60.0).start()
    try:
        stopped.stopped = False  # resumed: its next probe answer takes its inventory in
        deadline = time.monotonic() + 30
        while ctl.awaits_inventory("u1"):
            assert time.monotonic() < deadline, "the resumed unit's inventory was never adopted"
            time.sleep(0.01)
    finally:
        monitor.stop()
    assert ctl.where(list(arrays)) == {key: f"u{i % 2}" for i, key in enumerate(arrays)}
    assert ctl.total_keys() == 6 and ctl.stats()["u1"]["directory_bytes"] == 4 * (11 + 13 + 15)
    # Adopted now, the unit is reconciled again: a true orphan goes in two rounds, its keys stay.
    units["u1"].put("orphan", arrays["k0"])
    for now[0] in (40.0, 50.0):
        janitor.run_once()
    assert janitor.orphans_removed == 1 and sorted(units["u1"].list()) == ["k1", "k3", "k5"]
    for key in ("k1", "k3", "k5"):
        np.testing.assert_array_equal(units["u1"].get(key), arrays[key])


def test_after_the_controller_process_is_killed_it_is_started_again_and_every_committed_key_is_readable():
    tq = TransferQueue.start({"deployment": "local", "num_storage_units": 2, "unit_memory_budget": "64MiB",
                              "request_timeout_s": 10, "retention_s": None})
    try:
        client = tq.client()
        rng = np.random.default_rng(0)
        arrays = [rng.standard_normal((int(n), 8)).astype(np.float32) for n in rng.integers(1, 4000, 24)]
        refs = [client.put("logprobs", a) for a in arrays]
        old_pid = tq.processes()["controller"]
        os.kill(old_pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while tq.processes()["controller"] == old_pid or tq._deployment.controller_restarts < 1:
            assert time.monotonic() < deadline, "the Controller was not started again"
            time.sleep(0.05)
        assert tq.controller.ping() != old_pid
        assert tq.total_keys() == len(refs)
        got = client.get_many(refs, copy=True)
        for a, b in zip(arrays, got):
            np.testing.assert_array_equal(a, b)
        # The restarted directory places and serves new keys too, and deletes what it recovered.
        extra = client.put("logprobs", arrays[0])
        np.testing.assert_array_equal(client.get(extra), arrays[0])
        assert client.delete(refs) == len(refs)
        assert tq.total_keys() == 1
    finally:
        tq.shutdown()


def test_a_leased_placement_of_a_key_the_restarted_controller_adopted_claims_it_instead_of_conflicting():
    ctl = Controller([UnitInfo("u0", memory_budget=64 * MiB), UnitInfo("u1", memory_budget=64 * MiB)])
    ctl.adopt("u0", [("k", 40), ("other", 8)])
    grant = ctl.lease(100)
    ctl.place_leased(grant["lease"], "u0", [("k", 40, "logprobs")], batch="rollout-3")  # the writer's claim
    assert ctl.keys("rollout-3") == ["k"] and ctl.stats()["u0"]["directory_bytes"] == 48  # charged once
    # A different size, another unit, or a second claim is a write-once conflict as before.
    for unit, size in (("u0", 41), ("u1", 8)):
        try:
            ctl.place_leased(grant["lease"], unit, [("other", size, "logprobs")])
            raise AssertionError("a mismatched claim was accepted")
        except Exception as exc:
            assert "write-once" in str(exc)
    try:
        ctl.place_leased(grant["lease"], "u0", [("k", 40, "logprobs")])
        raise AssertionError("a key was claimed twice")
    except Exception as exc:
        assert "write-once" in str(exc)


@pytest.mark.ray
def test_on_ray_the_controller_process_is_started_again_and_every_committed_key_is_readable():
    pytest.importorskip("ray")
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    ray.init(address=cluster.address, include_dashboard=False)  # its own cluster, never one found running
    tq = None
    try:
        tq = TransferQueue.start({"deployment": "ray", "unit_memory_budget": "16MiB", "request_timeout_s": 10,
                                  "retention_s": None, "startup_timeout_s": 120})
        client = tq.client()
        arrays = [np.full((100 + i, 4), i, dtype=np.float32) for i in range(8)]
        refs = [client.put("logprobs", a) for a in arrays]
        old_pid = tq.processes()["controller"]
        os.kill(old_pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while tq._deployment.controller_restarts < 1:
            assert time.monotonic() < deadline, "the Controller was not started again"
            time.sleep(0.05)
        assert tq.processes()["controller"] != old_pid and tq.total_keys() == len(refs)
        for a, b in zip(arrays, client.get_many(refs, copy=True)):
            np.testing.assert_array_equal(a, b)
        assert client.delete(refs) == len(refs)
    finally:
        if tq is not None:
            tq.shutdown()
        ray.shutdown()
        cluster.shutdown()


def test_a_call_in_flight_when_the_controller_process_dies_ends_at_once_and_the_next_one_is_served():
    from dressage.tq.directory.service import RemoteController

    with TransferQueue.start({"deployment": "local", "unit_memory_budget": "16MiB", "retention_s": None}) as tq:
        spec = tq.client_spec()
        ctl = RemoteController(spec["controller"], timeout_s=120, secret=spec["auth_secret"].encode())
        try:
            assert ctl.ping() == tq.processes()["controller"]
            pid = tq.processes()["controller"]
            os.kill(pid, signal.SIGSTOP)  # it reads nothing now: the next request stays unanswered
            outcome = {}

            def call():
                try:
                    outcome["pid"] = ctl.ping()
                except StorageUnitUnavailable as exc:
                    outcome["error"] = str(exc)

            import threading

            thread = threading.Thread(target=call)
            thread.start()
            time.sleep(0.3)  # the request is on its way (a wait for the sender, not a measurement)
            os.kill(pid, signal.SIGKILL)
            thread.join(60)
            assert not thread.is_alive(), "the call waited out its 120 s timeout"
            assert "connection closed before the reply" in outcome.get("error", ""), outcome
            deadline = time.monotonic() + 60
            while tq._deployment.controller_restarts < 1:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert ctl.ping() == tq.processes()["controller"] != pid
        finally:
            ctl.close()


def test_a_unit_inventory_is_paged_and_names_spilled_keys_with_their_sizes(tmp_path, monkeypatch):
    from dressage.tq.storage import SpillStorageUnit
    from dressage.tq.storage import server as unit_server
    from dressage.tq.storage.remote import RemoteStorageUnit
    from dressage.tq.storage.server import StorageUnitServer

    monkeypatch.setattr(unit_server, "INVENTORY_PAGE", 2)
    backend = SpillStorageUnit("s0", memory_budget=100, spill_dir=tmp_path)
    sizes = {f"k{i}": 8 * (i + 1) for i in range(5)}
    for key, n in sizes.items():
        backend.put(key, np.zeros(n, dtype=np.uint8))
    assert any(backend.info(k).spilled for k in sizes)
    server = StorageUnitServer(backend, shared_memory=False).start()
    remote = RemoteStorageUnit("s0", server.address, timeout_s=10)
    try:
        assert sorted(remote.inventory()) == sorted(sizes.items())
        assert server.rpc.served >= 3  # three pages of at most two keys
    finally:
        remote.close()
        server.stop()
        backend.close()


def test_a_key_put_and_deleted_while_its_unit_awaited_adoption_stays_deleted():
    ctl = Controller([UnitInfo("u0"), UnitInfo("u1")])
    ctl.await_inventory("u1")  # a restarted directory could not ask u1; u1 is live and takes new puts
    ctl.mark_unit_dead("u0", "down")  # so the put lands on u1
    unit = ctl.place_many([("new", 10, "f")], node_id=None)
    assert unit == "u1"
    ctl.commit_many(["new"], unit_id=unit)
    ctl.delete(["new"])  # the client's delete; the unit could not be reached, so it stays queued
    assert ctl.state("new") is KeyState.CLEARED
    adopted = ctl.adopt(unit, [("old", 7), ("new", 10)])  # the unit answers: its inventory, both keys on it
    assert adopted == 1 and ctl.state("old") is KeyState.WRITTEN and ctl.state("new") is KeyState.CLEARED
    assert "new" in ctl.take_deletions().get(unit, [])  # the janitor still deletes the blob
    assert ctl.total_keys() == 1


def test_a_unit_that_answers_probes_but_never_its_inventory_goes_dead_and_is_adopted_when_it_does():
    unit = MemoryStorageUnit("u1", memory_budget=64 * MiB)
    unit.put("k", np.ones(4, np.float32))
    ctl = Controller([UnitInfo("u1", memory_budget=64 * MiB)])
    ctl.await_inventory("u1")

    class NoInventory(_Stopped):
        failing = True

        def inventory(self):
            if self.failing:
                raise StorageUnitUnavailable("unit u1: the inventory timed out")
            return super().inventory()

    probe = NoInventory(unit)
    probe.stopped = False  # it answers every ping
    monitor = LivenessMonitor(LateAdoption(ctl, {"u1": probe}), {"u1": probe}, interval_s=0.02,
                              dead_after_s=0.3).start()
    try:
        deadline = time.monotonic() + 30
        while ctl.dead_reason("u1") is None:
            assert time.monotonic() < deadline, "a unit whose inventory never came was never marked dead"
            time.sleep(0.01)
        assert ctl.awaits_inventory("u1") and ctl.total_keys() == 0 and "answered no inventory request" in ctl.dead_reason("u1")
        probe.failing = False  # its inventory answers: adopted, and live again
        while ctl.awaits_inventory("u1") or ctl.dead_reason("u1") is not None:
            assert time.monotonic() < deadline, "the unit's inventory was never adopted"
            time.sleep(0.01)
    finally:
        monitor.stop()
    assert ctl.where(["k"]) == {"k": "u1"}


def test_a_key_deleted_while_its_unit_awaits_adoption_is_deleted_there_when_adopted_not_brought_back():
    # A restarted Controller could not ask u1; a trainer deletes its refs meanwhile (the directory does
    # not know them yet): adopting u1 later must not make them readable again, and must delete them there.
    units = {u: MemoryStorageUnit(u, memory_budget=64 * MiB) for u in ("u0", "u1")}
    for key in ("gone", "kept"):
        units["u1"].put(key, np.ones(4, np.float32))
    ctl = Controller([UnitInfo(u, memory_budget=64 * MiB) for u in units])
    report = recover_directory(ctl, {"u0": units["u0"], "u1": _Stopped(units["u1"])})
    assert list(report.unreachable) == ["u1"]
    assert ctl.delete(["gone", "never-was"]) == {}  # unknown for now
    assert ctl.adopt("u1", units["u1"].inventory()) == 1
    assert ctl.where(["gone", "kept"]) == {"kept": "u1"} and ctl.total_keys() == 1
    janitor = Janitor(ctl, units.get, interval_s=1.0, reconcile_s=None)
    assert janitor.run_once() == 1 and units["u1"].list() == ["kept"]
    assert not ctl._deleted_unknown  # every unit adopted: nothing more to remember
