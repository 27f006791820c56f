"""The Controller process reads its units from stdin when the launcher starts it before they are up
(``--units -``, as the ``ray`` deployment does): a good list serves, a bad one is refused at once."""

from __future__ import annotations

import json

import pytest

from dressage.tq.directory.entries import UnitInfo
from dressage.tq.directory.service import RemoteController
from dressage.tq.deploy.children import await_ready, launch_child, stop_children

ARGS = ["dressage.tq.directory.main", "--units", "-", "--sweep-s", "0.2", "--heartbeat-s", "0.2",
        "--dead-after-s", "1.0"]


def test_units_from_stdin_are_served():
    proc = launch_child(ARGS, stdin=True)
    try:
        units = [UnitInfo("u0", "node-a", 1 << 20, "tcp://127.0.0.1:9", heartbeat="tcp://127.0.0.1:9").to_wire()]
        proc.stdin.write((json.dumps(units) + "\n").encode())
        proc.stdin.close()
        _, address = await_ready(proc, "Controller", 30)
        ctl = RemoteController(address, timeout_s=10)
        try:
            assert [u.unit_id for u in ctl.units()] == ["u0"] and ctl.ping() == proc.pid
            assert ctl.place_many([("k", 10, "logprobs")]) == "u0"
        finally:
            ctl.close()
    finally:
        stop_children([proc])


@pytest.mark.parametrize("line", ["not json", '{"unit_id": "u0"}', "[1]"])
def test_a_bad_unit_list_on_stdin_stops_the_process_with_a_usage_error(line):
    proc = launch_child(ARGS, stdin=True)
    try:
        proc.stdin.write((line + "\n").encode())
        proc.stdin.close()
        assert proc.wait(30) == 2
    finally:
        stop_children([proc])
