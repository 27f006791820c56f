"""Placement keeps payload off the head node while units on other nodes can take it."""

from __future__ import annotations

import pytest

from dressage.errors import ProtocolError
from dressage.testing import serve_controller
from dressage.tq import Controller, UnitInfo

MiB = 1 << 20


def _units(budget=10 * MiB):
    return [UnitInfo("u-head", "node-head", budget, head=True), UnitInfo("u-a", "node-a", budget),
            UnitInfo("u-b", "node-b", budget)]


def test_a_writer_on_the_head_node_still_writes_elsewhere():
    ctl = Controller(_units())
    placed = [ctl.place(f"k{i}", MiB, node_id="node-head") for i in range(6)]
    assert "u-head" not in placed and set(placed) == {"u-a", "u-b"}  # and they fill evenly
    assert ctl.place("near-a", MiB, node_id="node-a") == "u-a"       # local preference off the head holds


def test_the_head_unit_is_the_last_resort():
    ctl = Controller(_units(budget=2 * MiB))
    for i in range(4):
        assert ctl.place(f"k{i}", MiB) in ("u-a", "u-b")
    assert ctl.place("overflow", MiB) == "u-head"  # the others are full
    ctl2 = Controller(_units())
    ctl2.mark_unit_dead("u-a", "test")
    ctl2.mark_unit_dead("u-b", "test")
    assert ctl2.place("only-head", MiB) == "u-head"  # every other unit is dead


def test_a_single_node_cluster_uses_its_unit():
    ctl = Controller([UnitInfo("u0", "n0", 10 * MiB)])
    assert ctl.place("k", MiB, node_id="n0") == "u0"


def test_head_flag_crosses_the_controller_socket():
    served = serve_controller(Controller([UnitInfo("u-a", "node-a", 10 * MiB)]))
    try:
        served.add_unit(UnitInfo("u-head", "node-head", 100 * MiB, head=True))
        assert {u.unit_id: u.head for u in served.units()} == {"u-a": False, "u-head": True}
        # the head unit has more room, and still gets nothing while u-a has some
        assert served.place_many([("k", MiB, "logprobs")], node_id="node-head") == "u-a"
        with pytest.raises(ProtocolError, match="head"):
            served._rpc.call("add_unit", {"unit": {"unit_id": "u-x", "head": "yes"}})
    finally:
        served.close()


def test_the_ray_deployment_finds_the_head_by_its_resource():
    pytest.importorskip("ray")
    from dressage.tq.deploy.ray_actors import _is_head

    head = {"NodeID": "a", "Alive": True, "Resources": {"CPU": 1.0, "node:__internal_head__": 1.0}}
    worker = {"NodeID": "b", "Alive": True, "Resources": {"CPU": 1.0, "node:10.0.0.2": 1.0}}
    assert _is_head(head) and not _is_head(worker) and not _is_head({"NodeID": "c"})


def test_the_ray_deployment_puts_no_unit_on_the_head_while_other_nodes_exist():
    pytest.importorskip("ray")
    from dressage.tq.config import TransferQueueConfig
    from dressage.errors import ConfigError
    from dressage.tq.deploy.ray_actors import _unit_nodes

    head, w1, w2 = ({"NodeID": n} for n in ("h", "w1", "w2"))
    nodes = [head, w1, w2]
    assert [n["NodeID"] for n in _unit_nodes(nodes, {"h"}, False)] == ["w1", "w2"]
    assert [n["NodeID"] for n in _unit_nodes(nodes, {"h"}, True)] == ["h", "w1", "w2"]
    # a one-node cluster keeps its unit on the head: there is nowhere else
    assert [n["NodeID"] for n in _unit_nodes([head], {"h"}, False)] == ["h"]
    assert TransferQueueConfig().head_storage_unit is False
    with pytest.raises(ConfigError, match="head_storage_unit"):
        TransferQueueConfig(head_storage_unit="no")
