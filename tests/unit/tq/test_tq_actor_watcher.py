"""The ``ray`` deployment's actor watcher tells the Controller of a dead unit actor until a report gets
through, and tells each Controller process started again after that, too."""

from __future__ import annotations

import time

from dressage.errors import StorageUnitUnavailable
from dressage.tq.deploy.ray_actors import _ActorWatcher
from dressage.tq.directory.controller import Controller
from dressage.tq.directory.entries import UnitInfo


class _ControllerAddress:
    """The watcher's handle on the Controller's address: the process behind it may be starting again
    (every request refused) or be a new one."""

    def __init__(self, controller):
        self.controller, self.refusing, self.refused = controller, False, 0

    def mark_unit_dead(self, unit_id, reason):
        if self.refusing:
            self.refused += 1
            raise StorageUnitUnavailable("Controller at tcp://127.0.0.1:9 is unavailable (no reply within 2 s)")
        return self.controller.mark_unit_dead(unit_id, reason)

    def close(self):
        pass


def _directory():
    return Controller([UnitInfo(u, memory_budget=1 << 20) for u in ("unit0", "unit1")])


def _wait_dead(ctl, unit_id):
    deadline = time.monotonic() + 10
    while ctl.dead_reason(unit_id) is None:
        assert time.monotonic() < deadline, ctl.unit_states()
        time.sleep(0.01)
    return ctl.dead_reason(unit_id)


def test_a_dead_unit_is_reported_until_heard_and_again_to_a_restarted_controller():
    first = _directory()
    address = _ControllerAddress(first)
    address.refusing = True
    watcher = _ActorWatcher({}, address, interval_s=0.02).start()
    try:
        watcher.unit_died("unit0", "Ray actor died: ActorDiedError")
        deadline = time.monotonic() + 30
        while address.refused < 2:  # two rounds refused
            assert time.monotonic() < deadline, "a refused report was not sent again"
            time.sleep(0.01)
        assert first.dead_reason("unit0") is None
        address.refusing = False  # the report that failed is sent again
        assert "Ray actor died" in _wait_dead(first, "unit0")
        # The Controller process dies and starts again: the new directory holds every unit as live.
        address.controller = restarted = _directory()
        watcher.forget_reports()
        assert "Ray actor died" in _wait_dead(restarted, "unit0")
        assert restarted.dead_reason("unit1") is None and first.dead_reason("unit1") is None
    finally:
        watcher.stop()
