"""``ray`` deployment on a simulated 3-node cluster: one StorageUnit per node, data over ZMQ."""

from __future__ import annotations

import time

import numpy as np
import psutil
import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from dressage.testing import kill_unit  # noqa: E402
from dressage.tq import FieldRef, TransferQueue, TransferQueueClient  # noqa: E402

pytestmark = pytest.mark.ray
STORE = 80 * 1024 * 1024


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": STORE,
                                                       "include_dashboard": False})
    for _ in range(2):
        c.add_node(num_cpus=1, object_store_memory=STORE)
    ray.init(address=c.address, include_dashboard=False)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def tq(cluster):
    with TransferQueue.start({"deployment": "ray", "unit_memory_budget": "16MiB", "request_timeout_s": 20,
                              "head_storage_unit": True}) as tq:
        yield tq


@ray.remote(num_cpus=0)
class Writer:
    def __init__(self, spec):
        self.client = TransferQueueClient.connect(spec)

    def write(self, n, batch):
        refs = [self.client.put("routed_experts", np.full((256, 4, 2), i, dtype=np.uint8), batch=batch)
                for i in range(n)]
        return [r.to_wire() for r in refs], ray.get_runtime_context().get_node_id()


@ray.remote(num_cpus=0)
class Reader:
    def __init__(self, spec):
        self.client = TransferQueueClient.connect(spec)

    def read(self, wires):
        refs = [FieldRef.from_wire(w).narrow(8, 16) for w in wires]
        arrays = self.client.get_many(refs, consume=True)
        return [int(a.astype(np.int64).sum()) for a in arrays], self.client.counters.as_dict()


def on(node_id):
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def test_one_unit_per_node_placed_by_node_id(tq):
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    unit_nodes = {u.unit_id: u.node_id for u in tq.units()}
    assert len(unit_nodes) == 3 and set(unit_nodes.values()) == nodes
    pids = tq.processes()
    assert set(pids) == {"controller", "unit0", "unit1", "unit2"} and len(set(pids.values())) == 4


def test_by_default_the_head_runs_no_unit_and_holds_no_payload(cluster):
    head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])
    with TransferQueue.start({"deployment": "ray", "unit_memory_budget": "1MiB", "request_timeout_s": 20}) as tq:
        unit_nodes = {u.unit_id: u.node_id for u in tq.units()}
        assert len(unit_nodes) == 2 and head not in unit_nodes.values()
        assert set(tq.processes()) == {"controller", "unit0", "unit1"}
        ref = tq.client(node_id=head).put("logprobs", np.arange(4, dtype=np.float32))
        assert unit_nodes[ref.unit_id] != head


def test_writer_prefers_its_node_reader_elsewhere_reads_rows_and_clear_leaves_nothing(tq):
    units = {u.node_id: u.unit_id for u in tq.units()}
    node_ids = list(units)
    spec = tq.client_spec()
    writer = Writer.options(scheduling_strategy=on(node_ids[1])).remote(spec)
    reader = Reader.options(scheduling_strategy=on(node_ids[2])).remote(spec)
    wires, writer_node = ray.get(writer.write.remote(4, "step-0"))
    assert writer_node == node_ids[1]
    assert {FieldRef.from_wire(w).unit_id for w in wires} == {units[node_ids[1]]}  # node affinity
    sums, counters = ray.get(reader.read.remote(wires))
    assert sums == [i * 8 * 4 * 2 for i in range(4)]
    assert counters["get_requests"] == 1 and counters["bytes_read"] == 4 * 8 * 8
    unit_stats = tq.stats()[units[node_ids[1]]]
    assert unit_stats["rows_read"] >= 32 and unit_stats["keys"] == 4
    client = tq.client()
    assert client.clear("step-0") == 4
    assert tq.total_keys() == 0
    ray.kill(writer)
    ray.kill(reader)


def test_shutdown_stops_every_actor(cluster):
    tq = TransferQueue.start({"deployment": "ray", "num_storage_units": 2, "unit_memory_budget": "1MiB"})
    client = tq.client()
    ref = client.put("logprobs", np.arange(10, dtype=np.float32))
    np.testing.assert_array_equal(client.get(ref), np.arange(10))
    pids = tq.processes()
    tq.shutdown()
    # Ray kills the actor processes asynchronously; give it a moment.
    deadline = time.monotonic() + 15
    while any(psutil.pid_exists(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(psutil.pid_exists(p) for p in pids.values())


def test_shutdown_after_a_unit_actor_died_leaves_no_shm_segment_of_any_unit(cluster):
    import glob

    tq = TransferQueue.start({"deployment": "ray", "num_storage_units": 2, "unit_memory_budget": "16MiB",
                              "heartbeat_interval_s": 0.2, "unit_dead_after_s": 1.0})  # both off the head
    try:
        tokens = {u.unit_id: u.shm_token for u in tq.units()}
        assert all(tokens.values())
        client = tq.client()
        refs = [client.put("routed_experts", np.full(1 << 20, i, dtype=np.uint8)) for i in range(6)]
        assert {r.unit_id for r in refs} == {"unit0", "unit1"}  # each unit maps segments this driver wrote
        assert all(glob.glob(f"/dev/shm/dtq-{t}-*") for t in tokens.values())
        ray.kill(tq._deployment._unit_actors["unit0"])
        deadline = time.monotonic() + 30
        while tq.unit_states()["unit0"]["state"] != "dead":
            assert time.monotonic() < deadline, tq.unit_states()
            time.sleep(0.05)
    finally:
        tq.shutdown()
    # The survivor stopped (removing its own) before any kill; the dead unit's were removed for it.
    assert {u: glob.glob(f"/dev/shm/dtq-{t}-*") for u, t in tokens.items()} == {"unit0": [], "unit1": []}


def test_a_killed_unit_actor_is_marked_dead_and_puts_go_to_the_live_units(cluster):
    from dressage.errors import StorageUnitUnavailable

    with TransferQueue.start({"deployment": "ray", "num_storage_units": 2, "unit_memory_budget": "1MiB",
                              "head_storage_unit": True, "heartbeat_interval_s": 0.2, "unit_dead_after_s": 1.0,
                              "request_timeout_s": 20}) as tq:
        nodes = {u.unit_id: u.node_id for u in tq.units()}
        assert {u.unit_id: u.head for u in tq.units()} == {"unit0": True, "unit1": False}
        writers = {u: tq.client(node_id=n) for u, n in nodes.items()}
        refs = {u: w.put("logprobs", np.arange(4, dtype=np.float32)) for u, w in writers.items()}
        # Payload stays off the head node: the head's writer, too, writes to unit1.
        assert {u: r.unit_id for u, r in refs.items()} == {"unit0": "unit1", "unit1": "unit1"}
        kill_unit(tq, "unit1")
        deadline = time.monotonic() + 10
        while tq.unit_states()["unit1"]["state"] != "dead":
            assert time.monotonic() < deadline, tq.unit_states()
            time.sleep(0.05)
        assert "Ray actor died" in tq.unit_states()["unit1"]["reason"] or "probe" in tq.unit_states()["unit1"]["reason"]
        client = writers["unit1"]                       # its own node's unit is gone: it writes elsewhere
        late = client.put("logprobs", np.arange(2, dtype=np.float32))
        assert late.unit_id == "unit0"                  # the head's unit is the last resort
        with pytest.raises(StorageUnitUnavailable, match="unit1") as info:
            client.get(refs["unit1"])
        # At once: the client knows the unit is dead; it does not wait out a request timeout.
        assert "no reply within" not in str(info.value) and "timed out" not in str(info.value)
        np.testing.assert_array_equal(client.get(late), np.arange(2))
