"""The Janitor reconciles the directory with what each unit holds: orphan blobs are swept, placed
keys (written or still in flight) are never touched, a dead unit is left alone."""

from __future__ import annotations

import numpy as np
import pytest

from dressage.errors import TransferQueueError
from dressage.tq.directory.controller import Controller

from dressage.tq.directory.entries import UnitInfo
from dressage.tq.directory.janitor import Janitor
from dressage.tq.storage import MemoryStorageUnit


def _setup():
    now = [0.0]
    units = {u: MemoryStorageUnit(u, memory_budget=1 << 20) for u in ("u0", "u1")}
    ctl = Controller([UnitInfo(u, memory_budget=1 << 20) for u in units])
    janitor = Janitor(ctl, units.get, interval_s=1.0, reconcile_s=10.0, clock=lambda: now[0])
    return now, units, ctl, janitor


def _write(ctl, units, key, value):
    uid = ctl.place(key, value.nbytes)
    units[uid].put(key, value)
    ctl.commit(key)
    return uid


def test_orphans_are_swept_after_two_rounds_and_placed_keys_stay():
    now, units, ctl, janitor = _setup()
    a = np.arange(8, dtype=np.int32)
    uid = _write(ctl, units, "live", a)
    other = "u1" if uid == "u0" else "u0"
    units[uid].put("orphan", a)                                  # no directory entry
    units[other].put("live", a)                                  # the directory places it on uid only
    inflight = ctl.place("inflight", a.nbytes)                   # placed, blob not written yet
    assert janitor.run_once() == 0                               # not due yet
    now[0] = 10.0
    assert janitor.run_once() == 0                               # first round: suspects only
    units[inflight].put("inflight", a)                           # the put lands
    ctl.commit("inflight")
    now[0] = 20.0
    assert janitor.run_once() == 2 and janitor.orphans_removed == 2
    assert sorted(units[uid].list()) == sorted(["live"] + (["inflight"] if inflight == uid else []))
    assert units[other].list() == (["inflight"] if inflight == other else [])
    np.testing.assert_array_equal(units[uid].get("live"), a)
    assert ctl.total_keys() == 2


def test_an_orphan_that_gets_placed_between_rounds_is_kept():
    now, units, ctl, janitor = _setup()
    a = np.arange(4, dtype=np.int32)
    units["u0"].put("late", a)
    assert janitor.reconcile() == 0
    ctl.place_many([("late", a.nbytes, "")])                     # the directory catches up
    uid = ctl.where(["late"])["late"]
    assert janitor.reconcile() == (0 if uid == "u0" else 1)
    assert units["u0"].exists("late") == (uid == "u0")


def test_a_dead_unit_is_not_reconciled():
    now, units, ctl, janitor = _setup()
    units["u1"].put("orphan", np.zeros(3, np.int32))
    ctl.mark_unit_dead("u1", "test")
    janitor.reconcile()
    janitor.reconcile()
    assert units["u1"].exists("orphan")
    ctl.mark_unit_live("u1")
    janitor.reconcile()
    assert janitor.reconcile() == 1 and not units["u1"].exists("orphan")


class _CountingUnit(MemoryStorageUnit):
    """Counts the delete requests it gets, keys included, whether or not they still held anything."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.asked: list[str] = []

    def delete(self, keys):
        keys = list(keys)
        self.asked += keys
        return super().delete(keys)


def test_a_clear_deletes_each_unit_copy_once_and_leaves_the_janitor_nothing():
    from dressage.tq import TransferQueueClient

    units = {u: _CountingUnit(u, memory_budget=1 << 20) for u in ("u0", "u1")}
    ctl = Controller([UnitInfo(u, memory_budget=1 << 20) for u in units])
    janitor = Janitor(ctl, units.get, interval_s=1.0, reconcile_s=None)
    client = TransferQueueClient(ctl, units)
    refs = [client.put("logprobs", np.full(8, i, np.float32), batch="b") for i in range(6)]
    refs += [client.put("logprobs", np.ones(8, np.float32), batch="other")]
    assert client.clear("b") == 6 and client.delete([refs[-1]]) == 1
    # The client deleted them itself and told the directory: nothing stays queued for the janitor.
    assert {u: s["queued_deletes"] for u, s in ctl.stats().items()} == {"u0": 0, "u1": 0}
    assert janitor.run_once() == 0
    assert sorted(k for u in units.values() for k in u.asked) == sorted(r.key for r in refs)
    assert all(not u.list() for u in units.values())


def test_a_clear_whose_unit_delete_failed_stays_queued_for_the_janitor():
    from dressage.tq import TransferQueueClient

    units = {u: _CountingUnit(u, memory_budget=1 << 20) for u in ("u0",)}
    ctl = Controller([UnitInfo("u0", memory_budget=1 << 20)])
    janitor = Janitor(ctl, units.get, interval_s=1.0, reconcile_s=None)
    client = TransferQueueClient(ctl, units)
    ref = client.put("logprobs", np.ones(8, np.float32), batch="b")
    real = units["u0"].delete
    units["u0"].delete = lambda keys: (_ for _ in ()).throw(OSError("disk gone"))
    try:
        client.clear("b")
    except OSError:
        pass
    assert ctl.stats()["u0"]["queued_deletes"] == 1  # not reported deleted: the janitor's to do
    units["u0"].delete = real
    assert janitor.run_once() == 1 and not units["u0"].exists(ref.key)


def test_a_copy_queued_again_by_a_late_commit_stays_queued_after_the_clearers_notice():
    # The write of a key still in flight when its batch was cleared can land after the clearing client's own
    # delete; its commit then queues the copy again, and the clearer's notice must not take that back.
    units = {u: MemoryStorageUnit(u, memory_budget=1 << 20) for u in ("u0",)}
    ctl = Controller([UnitInfo("u0", memory_budget=1 << 20)])
    janitor = Janitor(ctl, units.get, interval_s=1.0, reconcile_s=None)
    a = np.ones(8, np.float32)
    ctl.place_many([("early", a.nbytes, "lp"), ("late", a.nbytes, "lp")], batch="b")
    units["u0"].put("early", a)
    ctl.commit_many(["early"], unit_id="u0")
    placement = ctl.clear("b")                   # "late" is still pending: its write is in flight
    assert sorted(placement["u0"]) == ["early", "late"]
    units["u0"].delete(placement["u0"])          # the clearing client's own delete ...
    units["u0"].put("late", a)                   # ... before the write lands
    with pytest.raises(TransferQueueError, match="cleared or expired"):
        ctl.commit_many(["late"], unit_id="u0")  # its commit comes after the clear
    ctl.deleted("u0", placement["u0"])           # the clearer's notice comes last
    assert ctl.stats()["u0"]["queued_deletes"] == 1
    assert janitor.run_once() == 1 and units["u0"].list() == []
    ctl.deleted("u0", ["late"])                  # nothing left to take back
    assert ctl.stats()["u0"]["queued_deletes"] == 0 and not ctl._late_copies
