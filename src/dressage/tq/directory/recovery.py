"""Directory recovery: a Controller that starts over units which already hold keys adopts them.

The units are the truth about which payloads exist; the directory is rebuilt from their inventories
(key and size), so a Controller process that died and was started again loses no committed key. A unit
that cannot be asked then (stopped, overloaded) is asked again when it first answers a liveness probe
(``LateAdoption``); until then the Janitor takes nothing on it for an orphan.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dressage.errors import TransferQueueError
from dressage.tq.directory.controller import Controller

__all__ = ["LateAdoption", "Recovery", "recover_directory"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Recovery:
    """What a recovery found: keys adopted per unit, and the units that could not be asked (and why)."""

    adopted: dict[str, int] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)

    @property
    def keys(self) -> int:
        return sum(self.adopted.values())

    def describe(self) -> str:
        text = f"recovered {self.keys} key(s) from {len(self.adopted)} StorageUnit(s)"
        if self.unreachable:
            text += "; not reachable: " + "; ".join(f"{u} ({why})" for u, why in self.unreachable.items())
        return text


def recover_directory(controller: Controller, units: Mapping[str, Any]) -> Recovery:
    """Adopt every key each unit (a StorageUnit handle: its ``inventory()``) holds into ``controller``'s
    directory. A unit that does not answer is reported, not fatal: the directory records that its
    inventory is still to come (``Controller.await_inventory``), for ``LateAdoption`` to take in."""
    out = Recovery()

    def one(unit_id: str) -> None:
        try:
            out.adopted[unit_id] = controller.adopt(unit_id, units[unit_id].inventory())
        except TransferQueueError as exc:
            controller.await_inventory(unit_id)
            out.unreachable[unit_id] = str(exc)

    # Asked together: a unit that does not answer costs its timeout once, not once per unit.
    if units:
        with ThreadPoolExecutor(max_workers=min(len(units), 32), thread_name_prefix="tq-recovery") as pool:
            list(pool.map(one, list(units)))
    if out.keys or out.unreachable:
        log.warning("Controller: %s", out.describe())
    return out


class LateAdoption:
    """What the ``LivenessMonitor`` reports to, in front of the Controller: a unit recovery could not ask
    has its inventory adopted the first time it answers a probe, before it counts as live again.

    ``units`` maps those units to handles with ``inventory()``; each is used by its unit's probe thread
    only. An inventory that fails raises, so that probe counts as unanswered and the next one asks again.
    """

    def __init__(self, controller: Controller, units: Mapping[str, Any]) -> None:
        self._controller = controller
        self._units = dict(units)

    def mark_unit_live(self, unit_id: str) -> bool:
        unit = self._units.get(unit_id)
        if unit is not None and self._controller.awaits_inventory(unit_id):
            n = self._controller.adopt(unit_id, unit.inventory())
            log.warning("Controller: recovered %d key(s) from StorageUnit %s, which answered after the recovery",
                        n, unit_id)
        return self._controller.mark_unit_live(unit_id)

    def mark_unit_dead(self, unit_id: str, reason: str) -> bool:
        return self._controller.mark_unit_dead(unit_id, reason)

    def close(self) -> None:
        for unit in self._units.values():
            unit.close()
