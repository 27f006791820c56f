"""``ControllerTests``: the conformance suite of a TransferQueue Controller (the key directory).

Subclass it and define ``make_controller(units, *, strict_budget=False)``: a new Controller (or a
client of one over the wire) that knows ``units`` and, with ``strict_budget``, refuses placements that
fit no live unit. The test calls ``close()`` on it when it has one. Checked, with values:

- placement: the writer's node first, then most free bytes, equal units filling evenly; live units only;
  a full directory with ``strict_budget`` is StorageFullError with nothing reserved;
- commit: pending -> written, consumed stays consumed, a key cleared while in flight is an error;
- touch: renews the keys the directory holds, changes no state; ``retention()``;
- write-once keys, and ``place_many`` all or nothing;
- delete / clear / abort: what each unit must delete, tombstones (``state`` CLEARED), freed bytes;
- unit states: dead with its reason, live again, ``add_unit``;
- stats: directory keys and bytes, pending writes, queued deletions, state per unit.

Our own tests run it against the in-process :class:`~dressage.tq.Controller` and against the ZMQ
service (:class:`~dressage.tq.directory.service.ControllerServer` reached through
:class:`~dressage.tq.directory.service.RemoteController`); :func:`serve_controller` builds the latter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from dressage.errors import StorageFullError, StorageUnitUnavailable, TransferQueueError
from dressage.tq.directory.controller import Controller
from dressage.tq.directory.entries import KeyState, UnitInfo

__all__ = ["ControllerTests", "serve_controller"]

THREE = (UnitInfo("a", "n0", 100), UnitInfo("b", "n1", 100), UnitInfo("c", "n1", 100))


class ControllerTests:
    """Behaviour every Controller must have. Subclasses provide ``make_controller``."""

    def make_controller(self, units: Sequence[UnitInfo], *, strict_budget: bool = False) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define make_controller(units, strict_budget=...)")

    @pytest.fixture
    def open_controller(self):
        made: list[Any] = []

        def make(units: Sequence[UnitInfo] = THREE, **kwargs: Any) -> Any:
            ctl = self.make_controller(units, **kwargs)
            made.append(ctl)
            return ctl

        yield make
        for ctl in made:
            close = getattr(ctl, "close", None)
            if close is not None:
                close()

    @pytest.fixture
    def ctl(self, open_controller):
        return open_controller()

    # -- placement ---------------------------------------------------------------------------
    def test_placement_prefers_the_writers_node_then_free_capacity(self, ctl):
        assert ctl.place("k1", 60, node_id="n0") == "a"
        assert ctl.place("k2", 60, node_id="n0") in ("b", "c")  # a is out of room: free capacity wins
        assert ctl.place("k3", 10, node_id="n1") in ("b", "c")
        assert ctl.place("k4", 10, node_id="nowhere") in ("b", "c")  # unknown node: the freest unit
        assert ctl.where(["k1", "k2", "k3", "k4", "never"]).keys() == {"k1", "k2", "k3", "k4"}

    def test_equal_units_fill_evenly(self, ctl):
        placed = [ctl.place(f"k{i}", 5) for i in range(9)]
        assert sorted(placed.count(u) for u in "abc") == [3, 3, 3]
        assert {u: s["directory_keys"] for u, s in ctl.stats().items()} == {"a": 3, "b": 3, "c": 3}

    def test_place_many_puts_every_key_on_one_unit_and_reserves_their_bytes(self, ctl):
        unit = ctl.place_many([("x", 30, "logprobs"), ("y", 40, "routed_experts")], batch="s")
        assert ctl.where(["x", "y"]) == {"x": unit, "y": unit}
        assert ctl.stats()[unit]["directory_bytes"] == 70
        assert sorted(ctl.keys("s")) == ["x", "y"] and ctl.keys("other") == []

    def test_keys_are_write_once_and_place_many_is_all_or_nothing(self, ctl):
        ctl.place("k", 10)
        with pytest.raises(TransferQueueError, match="write-once"):
            ctl.place("k", 10)
        with pytest.raises(TransferQueueError, match="write-once"):
            ctl.place_many([("fresh", 10, ""), ("k", 10, "")])
        with pytest.raises(TransferQueueError):
            ctl.place_many([("twice", 1, ""), ("twice", 1, "")])
        assert ctl.total_keys() == 1 and ctl.state("fresh") is None and ctl.state("twice") is None
        assert sum(s["directory_bytes"] for s in ctl.stats().values()) == 10

    def test_dead_units_get_no_new_keys_and_none_live_is_unavailable(self, ctl):
        assert ctl.mark_unit_dead("a", "test: process exited") is True
        assert ctl.mark_unit_dead("a", "again") is False          # already dead: no change
        assert all(ctl.place(f"k{i}", 1, node_id="n0") != "a" for i in range(4))
        ctl.mark_unit_dead("b", "gone")
        ctl.mark_unit_dead("c", "gone")
        with pytest.raises(StorageUnitUnavailable, match="no live StorageUnit"):
            ctl.place("lost", 1)
        assert ctl.state("lost") is None
        assert ctl.mark_unit_live("a") is True
        assert ctl.place("back", 1) == "a"

    def test_strict_budget_refuses_what_fits_nowhere_and_reserves_nothing(self, open_controller):
        ctl = open_controller((UnitInfo("u0", None, 100), UnitInfo("u1", None, 100)), strict_budget=True)
        ctl.place("k0", 80)
        ctl.place("k1", 80)
        with pytest.raises(StorageFullError):
            ctl.place("k2", 30)
        assert ctl.total_keys() == 2 and ctl.state("k2") is None
        assert sorted(s["directory_bytes"] for s in ctl.stats().values()) == [80, 80]
        ctl.delete(["k0"])
        assert ctl.place("k2", 30) in ("u0", "u1")

    def test_without_strict_budget_the_freest_unit_takes_an_oversized_key(self, open_controller):
        ctl = open_controller((UnitInfo("u0", None, 100), UnitInfo("u1", None, 100)))
        ctl.place("k0", 90)
        assert ctl.place("big", 500) == "u1"                       # it spills, waits or refuses per its policy

    # -- commit and lifecycle ----------------------------------------------------------------
    def test_commit_moves_pending_to_written_and_consumed_stays_consumed(self, ctl):
        unit = ctl.place("k", 10, batch="b")
        assert ctl.state("k") is KeyState.PENDING and ctl.stats()[unit]["pending"] == 1
        ctl.commit("k")
        assert ctl.state("k") is KeyState.WRITTEN and ctl.stats()[unit]["pending"] == 0
        assert ctl.mark_consumed(["k", "never"]) == 1
        ctl.commit_many(["k"])
        assert ctl.state("k") is KeyState.CONSUMED

    def test_commit_of_a_key_cleared_in_flight_is_an_error(self, ctl):
        ctl.place("k", 10)
        ctl.delete(["k"])
        with pytest.raises(TransferQueueError, match="cleared or expired"):
            ctl.commit("k")
        with pytest.raises(TransferQueueError):
            ctl.commit("never-placed")

    def test_touch_renews_keys_it_holds_and_changes_no_state(self, ctl):
        ctl.place("pending", 1)
        ctl.place("consumed", 1)
        ctl.commit("consumed")
        ctl.mark_consumed(["consumed"])
        assert ctl.touch(["pending", "consumed", "never"]) == 2
        assert ctl.state("pending") is KeyState.PENDING and ctl.state("consumed") is KeyState.CONSUMED
        assert ctl.touch([]) == 0 and ctl.total_keys() == 2
        assert ctl.retention() is None  # made without retention_s: keys stay until cleared

    def test_set_batch_moves_keys_between_batches(self, ctl):
        for k in ("x", "y", "z"):
            ctl.place(k, 1, batch="old")
        assert ctl.set_batch(["x", "y", "never"], "new") == 2
        assert sorted(ctl.keys("new")) == ["x", "y"] and ctl.keys("old") == ["z"]

    # -- delete, clear, abort ----------------------------------------------------------------
    def test_delete_returns_what_each_unit_must_delete_and_frees_the_bytes(self, ctl):
        units = {k: ctl.place(k, 10) for k in ("p", "q", "r")}
        for k in units:
            ctl.commit(k)
        out = ctl.delete(["p", "q", "never"])
        assert {u: sorted(ks) for u, ks in out.items()} == _by_unit({k: units[k] for k in ("p", "q")})
        assert ctl.state("p") is KeyState.CLEARED and ctl.state("never") is None
        assert ctl.delete(["p"]) == {}                             # a second delete finds nothing
        assert ctl.total_keys() == 1 and ctl.where(["p", "q", "r"]) == {"r": units["r"]}
        assert sum(s["directory_bytes"] for s in ctl.stats().values()) == 10

    def test_clear_removes_exactly_one_batch(self, ctl):
        units = {f"s1-{i}": ctl.place(f"s1-{i}", 4, batch="step-1") for i in range(5)}
        keep = ctl.place("s2", 4, batch="step-2")
        out = ctl.clear("step-1")
        assert {u: sorted(ks) for u, ks in out.items()} == _by_unit(units)
        assert ctl.keys() == ["s2"] and ctl.where(["s2"]) == {"s2": keep}
        assert ctl.clear("step-1") == {} and ctl.clear("no-such-batch") == {}

    def test_abort_forgets_the_key_and_its_reservation(self, ctl):
        unit = ctl.place("k", 50)
        ctl.abort("k")
        assert ctl.total_keys() == 0 and ctl.state("k") is KeyState.CLEARED
        assert ctl.stats()[unit]["directory_bytes"] == 0
        ctl.place("k", 50)                                         # a failed write may be retried
        ctl.commit("k")
        assert ctl.state("k") is KeyState.WRITTEN

    # -- units and stats ---------------------------------------------------------------------
    def test_unit_states_report_dead_with_the_reason_and_live_again(self, ctl):
        assert {u: s["state"] for u, s in ctl.unit_states().items()} == {"a": "live", "b": "live", "c": "live"}
        ctl.mark_unit_dead("b", "process 42 exited with code -9")
        states = ctl.unit_states()
        assert states["b"]["state"] == "dead" and "exited with code -9" in states["b"]["reason"]
        stats = ctl.stats()
        assert stats["b"]["state"] == "dead" and "exited" in stats["b"]["state_reason"]
        assert stats["a"]["state"] == "live"
        ctl.mark_unit_live("b")
        assert ctl.unit_states()["b"]["state"] == "live" and "answered again" in ctl.unit_states()["b"]["reason"]

    def test_add_unit_joins_the_directory_and_takes_keys(self, open_controller):
        ctl = open_controller((UnitInfo("u0", None, 10),))
        ctl.place("k0", 10)
        ctl.add_unit(UnitInfo("u1", "n9", 1000))
        assert [u.unit_id for u in ctl.units()] == ["u0", "u1"]
        assert [u.node_id for u in ctl.units()] == [None, "n9"]
        assert ctl.place("k1", 10) == "u1"                          # u0 is full, u1 has room

    def test_stats_count_keys_bytes_pending_and_queued_deletes_per_unit(self, ctl):
        units = [ctl.place(f"k{i}", 7 * (i + 1), node_id="n0") for i in range(3)]
        ctl.commit(f"k{0}")
        ctl.delete(["k2"])
        stats = ctl.stats()
        assert set(stats) == {"a", "b", "c"}
        expected_keys = {u: 0 for u in "abc"}
        expected_bytes = {u: 0 for u in "abc"}
        for i, u in enumerate(units[:2]):
            expected_keys[u] += 1
            expected_bytes[u] += 7 * (i + 1)
        assert {u: s["directory_keys"] for u, s in stats.items()} == expected_keys
        assert {u: s["directory_bytes"] for u, s in stats.items()} == expected_bytes
        assert sum(s["pending"] for s in stats.values()) == 1        # k1: placed, never committed
        assert stats[units[2]]["queued_deletes"] == 1                # k2 waits for the janitor
        assert stats["a"]["node_id"] == "n0" and stats["b"]["node_id"] == "n1"
        assert ctl.total_keys() == 2


def _by_unit(where: dict[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, unit in where.items():
        out.setdefault(unit, []).append(key)
    return {u: sorted(ks) for u, ks in out.items()}


class _ServedController:
    """A RemoteController whose ``close`` also stops the ControllerServer thread behind it."""

    def __init__(self, controller: Controller, **server_options: Any) -> None:
        from dressage.tq.directory.service import ControllerServer, RemoteController

        self.server = ControllerServer(controller, **server_options).start()
        self.remote = RemoteController(self.server.address, timeout_s=5, secret=server_options.get("secret"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.remote, name)

    def close(self) -> None:
        self.remote.close()
        self.server.stop()


def serve_controller(controller: Controller, **server_options: Any) -> Any:
    """``controller`` behind a ControllerServer thread, reached through a RemoteController (same methods);
    closing it stops the server too."""
    return _ServedController(controller, **server_options)
