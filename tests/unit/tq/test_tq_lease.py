"""Placement leases: capacity set aside once, small puts placed on it, the directory's accounting exact."""

from __future__ import annotations

import time

import numpy as np
import pytest

from dressage.errors import StorageFullError, StorageUnitUnavailable, TransferQueueError
from dressage.tq import TransferQueue, TransferQueueClient
from dressage.tq.directory.controller import Controller
from dressage.tq.directory.entries import KeyState, UnitInfo
from dressage.tq.directory import lease as lease_mod
from dressage.tq.directory.lease import LEASE_MAX_BYTES, LEASE_PUT_MAX, LEASE_SHARE, LEASE_TTL_S
from dressage.tq.directory.liveness import VIEW_TTL_S

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def ctl(*units: UnitInfo, strict: bool = False) -> tuple[Controller, Clock]:
    clock = Clock()
    return Controller(list(units), clock=clock, strict_budget=strict), clock


def totals(c: Controller, field: str) -> dict[str, int]:
    return {u: s[field] for u, s in c.stats().items()}


def eventually(check, timeout_s: float = 10.0) -> bool:
    """For what a client sends one-way (a returned lease, a commit): true once the Controller applied it."""
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.005)
    return check()


def test_a_lease_sets_capacity_aside_on_every_unit_of_the_placement_pool():
    c, _ = ctl(UnitInfo("a", "n1", 64 * MiB), UnitInfo("b", "n1", 64 * MiB), UnitInfo("c", "n2", 64 * MiB),
               UnitInfo("h", "n1", 64 * MiB, head=True))
    grant = c.lease(1000, node_id="n1")
    # The writer's node first and never the head node: the pool ``place_many`` would choose from.
    assert grant is not None and set(grant["parts"]) == {"a", "b"} and grant["ttl_s"] == LEASE_TTL_S
    assert grant["parts"]["a"] == 64 * MiB // LEASE_SHARE
    assert totals(c, "leased_bytes") == {"a": 8 * MiB, "b": 8 * MiB, "c": 0, "h": 0}
    assert totals(c, "leases") == {"a": 1, "b": 1, "c": 0, "h": 0}
    assert totals(c, "directory_bytes") == {"a": 0, "b": 0, "c": 0, "h": 0}
    # Leased bytes are not free: a put placed the regular way goes where no lease holds them.
    assert c.place_many([("k", 1000, "f")], node_id=None) == "c"


def test_a_lease_is_at_most_its_cap_and_at_least_the_put():
    c, _ = ctl(UnitInfo("a", None, 4 << 30))
    assert c.lease(10)["parts"] == {"a": LEASE_MAX_BYTES}
    c2, _ = ctl(UnitInfo("a", None, 8 * MiB))
    assert c2.lease(3 * MiB)["parts"] == {"a": 3 * MiB}  # more than 1/8 of the unit: the put itself


def test_placing_on_a_lease_moves_bytes_from_the_lease_to_the_directory_exactly():
    c, _ = ctl(UnitInfo("a", None, 64 * MiB))
    grant = c.lease(100)
    leased = grant["parts"]["a"]
    c.place_leased(grant["lease"], "a", [("k1", 100, "f"), ("k2", 28, "g")], batch="b")
    assert c.state("k1") is KeyState.PENDING and c.total_keys() == 2
    s = c.stats()["a"]
    assert (s["directory_bytes"], s["directory_keys"], s["leased_bytes"], s["pending"]) == (128, 2, leased - 128, 2)
    c.commit_many(["k1", "k2"], unit_id="a")
    assert c.state("k2") is KeyState.WRITTEN
    assert sorted(c.clear("b")["a"]) == ["k1", "k2"]
    s = c.stats()["a"]
    assert (s["directory_bytes"], s["directory_keys"], s["leased_bytes"]) == (0, 0, leased - 128)
    c.return_lease(grant["lease"])
    assert c.stats()["a"]["leased_bytes"] == 0 and c.stats()["a"]["leases"] == 0


def test_a_refused_placement_records_nothing():
    c, _ = ctl(UnitInfo("a", None, 64 * MiB))
    grant = c.lease(100)
    c.place_many([("taken", 10, "f")])
    before = c.stats()["a"]
    with pytest.raises(TransferQueueError, match="write-once"):
        c.place_leased(grant["lease"], "a", [("new", 100, "f"), ("taken", 100, "f")])
    with pytest.raises(TransferQueueError, match="twice"):
        c.place_leased(grant["lease"], "a", [("x", 1, "f"), ("x", 1, "f")])
    with pytest.raises(TransferQueueError, match="unknown"):
        c.place_leased(grant["lease"], "nope", [("y", 1, "f")])
    assert c.stats()["a"] == before and c.state("new") is None and c.total_keys() == 1


def test_an_expired_lease_gives_its_rest_back_and_a_late_placement_is_still_counted_exactly():
    c, clock = ctl(UnitInfo("a", None, 64 * MiB))
    grant = c.lease(100)
    clock.t += LEASE_TTL_S + 0.1
    assert c.stats()["a"]["leased_bytes"] == 0 and c.stats()["a"]["leases"] == 0
    c.place_leased(grant["lease"], "a", [("late", 100, "f")])  # its unit copy exists: the bytes count
    s = c.stats()["a"]
    assert (s["directory_bytes"], s["directory_keys"], s["leased_bytes"]) == (100, 1, 0)


def test_unit_death_ends_its_part_of_every_lease_and_refuses_placements_there():
    c, _ = ctl(UnitInfo("a", None, 64 * MiB), UnitInfo("b", None, 64 * MiB))
    grant = c.lease(100)
    assert set(grant["parts"]) == {"a", "b"}
    c.mark_unit_dead("b", "test")
    assert totals(c, "leased_bytes") == {"a": 8 * MiB, "b": 0}
    with pytest.raises(StorageUnitUnavailable):
        c.place_leased(grant["lease"], "b", [("k", 100, "f")])
    assert c.total_keys() == 0
    c.place_leased(grant["lease"], "a", [("k", 100, "f")])
    assert c.where(["k"]) == {"k": "a"} and c.stats()["a"]["leased_bytes"] == 8 * MiB - 100
    assert set(c.lease(100)["parts"]) == {"a"}  # a new lease leaves the dead unit out


def test_no_lease_when_nothing_fits_and_strict_placement_is_refused_once_the_lease_is_spent():
    c, _ = ctl(UnitInfo("a", None, 1000), strict=True)
    assert c.lease(2000) is None
    grant = c.lease(600)
    assert grant["parts"] == {"a": 600}
    c.place_leased(grant["lease"], "a", [("k1", 600, "f")])
    with pytest.raises(StorageFullError):
        c.place_leased(grant["lease"], "a", [("k2", 600, "f")])
    assert c.total_keys() == 1 and c.stats()["a"]["directory_bytes"] == 600


# --- through a client whose Controller is in another thread, over ZMQ ---------------------------


@pytest.fixture
def served():
    with TransferQueue.start({"num_storage_units": 2, "unit_memory_budget": "64MiB", "request_timeout_s": 5,
                              "on_full": "error"}) as tq:
        client = TransferQueueClient.connect(tq.client_spec())
        yield tq, client
        client.close()


def test_small_puts_share_one_lease_spread_over_the_units_and_leave_zero_keys(served):
    tq, client = served
    ctl_ = tq.controller
    refs = [client.put("logprobs", np.full(1024, i, dtype=np.float32), batch="b") for i in range(10)]
    refs += client.put_many([("routed_experts", np.ones((64, 8), np.uint8)), ("logprobs", np.ones(64, np.float32))],
                            batch="b")
    assert client._fast_write.granted == 1  # one Controller round trip set aside the room for all of them
    assert {r.unit_id for r in refs[:10]} == {"unit0", "unit1"}  # equal units fill evenly
    assert [int(a[0]) for a in client.get_many(refs[:10])] == list(range(10))
    stats = ctl_.stats()
    assert sum(s["directory_keys"] for s in stats.values()) == 12
    assert sum(s["directory_bytes"] for s in stats.values()) == 10 * 4096 + 512 + 256
    leased = sum(s["leased_bytes"] for s in stats.values())
    assert leased == 2 * (64 * MiB // LEASE_SHARE) - (10 * 4096 + 512 + 256)
    assert client.clear("b") == 12 and client.total_keys() == 0
    client.close()
    assert eventually(lambda: all(s["leased_bytes"] == 0 and s["leases"] == 0 and s["directory_bytes"] == 0
                                  for s in ctl_.stats().values()))


def test_a_put_batcher_round_goes_through_a_lease_and_a_full_lease_carries_two_per_unit():
    # A PutBatcher round (up to its max_bytes, 32 MiB) is what the Proxy's writer sends: its placement
    # overlaps its write, and a lease of full size (64 MiB a unit) carries two of them on each unit.
    from dressage.tq.client.batching import PutBatcher

    probe = PutBatcher(None, name="probe")
    probe.close()
    assert LEASE_PUT_MAX == LEASE_MAX_BYTES // 2 == probe.max_bytes
    with TransferQueue.start({"num_storage_units": 2, "unit_memory_budget": "1GiB", "request_timeout_s": 5,
                              "on_full": "error"}) as tq:
        client = TransferQueueClient.connect(tq.client_spec())
        placed = []
        place_many = client._controller.place_many
        client._controller.place_many = lambda *a, **k: placed.append(a) or place_many(*a, **k)
        rounds = [[("routed_experts", np.full((LEASE_PUT_MAX // 2 // 320, 40, 8), 2 * r + i, np.uint8))
                   for i in range(2)] for r in range(4)]
        refs = [client.put_many(items, batch="b") for items in rounds]
        assert client._fast_write.granted == 1 and placed == []  # four rounds, one Controller round trip first
        assert sorted(len([r for r in refs if r[0].unit_id == u]) for u in client.unit_ids) == [2, 2]
        got = client.get_many([ref for pair in refs for ref in pair])
        assert [int(a[-1, -1, -1]) for a in got] == list(range(8))
        assert client.clear("b") == 8 and client.total_keys() == 0
        client.close()
        assert eventually(lambda: all(s["leased_bytes"] == 0 for s in tq.controller.stats().values()))


def test_a_leased_placement_sent_again_is_answered_as_the_first_and_records_once():
    c, _ = ctl(UnitInfo("a", "n1", 64 * MiB), UnitInfo("b", "n1", 64 * MiB))
    grant = c.lease(1000, node_id="n1")
    c.place_leased(grant["lease"], "a", [("k", 1000, "f")], batch="b", put_id="p1")
    c.place_leased(grant["lease"], "a", [("k", 1000, "f")], batch="b", put_id="p1")  # its reply was lost
    assert totals(c, "directory_keys") == {"a": 1, "b": 0} and totals(c, "directory_bytes") == {"a": 1000, "b": 0}
    with pytest.raises(TransferQueueError, match="write-once"):  # another placement of the same key
        c.place_leased(grant["lease"], "a", [("k", 1000, "f")], batch="b", put_id="p2")
    with pytest.raises(TransferQueueError, match="another unit"):
        c.place_leased(grant["lease"], "b", [("k", 1000, "f")], batch="b", put_id="p1")


def test_large_puts_are_placed_each_without_a_lease(served):
    _, client = served
    client.put("routed_experts", np.ones(LEASE_PUT_MAX + 1, dtype=np.uint8))
    assert client._fast_write.granted == 0


def test_a_key_refused_by_the_directory_fails_the_put_and_its_unit_copy_is_deleted(served):
    tq, client = served
    first = client.put("logprobs", np.ones(8, np.float32), key="same")
    target = next(u for u in client.unit_ids if u != first.unit_id)
    holder = client._fast_write
    holder._held.left = {target: holder._held.left[target]}  # the next put goes to the other unit
    with pytest.raises(TransferQueueError, match="write-once"):
        client.put("logprobs", np.zeros(8, np.float32), key="same")
    assert tq.controller.where(["same"]) == {"same": first.unit_id}
    tq.run_janitor()
    assert not tq.storage_units()[target].exists("same")
    np.testing.assert_array_equal(client.get(first), np.ones(8, np.float32))  # the first write is untouched


def test_a_failed_write_on_a_lease_records_nothing_and_returns_the_lease(served, monkeypatch):
    tq, client = served
    client.put("logprobs", np.ones(8, np.float32))
    before = tq.controller.total_keys()

    def down(*a, **k):
        raise StorageUnitUnavailable("unit unreachable (test)")

    for unit in client._units.values():
        monkeypatch.setattr(unit, "put_many", down)
    for attempt in range(2):  # each failed unit's part of the lease is dropped; with none left it goes back
        with pytest.raises(StorageUnitUnavailable):
            client.put("logprobs", np.ones(8, np.float32), key=f"lost{attempt}")
        assert tq.controller.total_keys() == before and tq.controller.where([f"lost{attempt}"]) == {}
    assert client._fast_write._held is None and client._fast_write.granted == 1
    assert eventually(lambda: all(s["leased_bytes"] == 0 and s["leases"] == 0
                                  for s in tq.controller.stats().values()))


def test_a_dead_units_part_of_the_lease_is_not_used(served):
    tq, client = served
    client.put("logprobs", np.ones(8, np.float32))
    tq.controller.mark_unit_dead("unit1", "test")
    time.sleep(VIEW_TTL_S + 0.05)  # the client's view of unit states is this stale at most
    refs = [client.put("logprobs", np.ones(8, np.float32)) for _ in range(6)]
    # The first put learns of the death from its placement's reply (which refreshes the stale view):
    # placed again the regular way, on the live unit. Then the lease's other part goes on serving.
    assert {r.unit_id for r in refs} == {"unit0"}
    assert client._fast_write.granted == 1 and set(client._fast_write._held.left) == {"unit0"}
    assert client.dead_units() == {"unit1": client.dead_units()["unit1"]}
    assert tq.controller.stats()["unit1"]["leased_bytes"] == 0
    tq.controller.mark_unit_live("unit1")
    tq.run_janitor()  # what the refused put left on unit1 is deleted
    assert tq.storage_units()["unit1"].list() == [] and tq.controller.stats()["unit1"]["directory_keys"] == 0


def test_a_leased_puts_commit_rides_on_the_next_placement_and_is_flushed_at_close(served, monkeypatch):
    tq, client = served
    monkeypatch.setattr(lease_mod, "COMMIT_SOON_S", 60.0)  # no flush by time in this test
    first = client.put("logprobs", np.ones(8, np.float32))
    assert tq.controller.state(first.key) is KeyState.PENDING  # durable in its unit, not yet visible
    second = client.put("logprobs", np.ones(8, np.float32))
    assert tq.controller.state(first.key) is KeyState.WRITTEN  # carried by the second put's placement
    assert tq.controller.state(second.key) is KeyState.PENDING
    client.close()
    assert eventually(lambda: tq.controller.state(second.key) is KeyState.WRITTEN)


def test_an_owed_commit_is_sent_by_itself_when_no_put_follows(served):
    tq, client = served
    ref = client.put("logprobs", np.ones(8, np.float32))
    assert eventually(lambda: tq.controller.state(ref.key) is KeyState.WRITTEN)
    assert tq.controller.stats()[ref.unit_id]["pending"] == 0


def test_a_late_commit_after_a_clear_leaves_nothing(served, monkeypatch, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="dressage.tq.directory.service")
    tq, client = served
    monkeypatch.setattr(lease_mod, "COMMIT_SOON_S", 60.0)
    ref = client.put("logprobs", np.ones(8, np.float32), batch="b")
    assert client.clear("b") == 1  # before its commit was sent
    client.close()  # sends it: the key is gone, so its unit copy is queued for deletion again
    assert eventually(lambda: "late commit" in caplog.text)  # it arrived, and found its key gone
    tq.run_janitor()
    assert tq.controller.total_keys() == 0 and tq.controller.state(ref.key) is KeyState.CLEARED
    assert all(u.list() == [] for u in tq.storage_units().values())
