"""Directory recovery: a Controller that starts over units which already hold keys adopts them.

The units are the truth about which payloads exist; the directory is rebuilt from their inventories
(key and size), so a Controller process that died and was started again loses no committed key.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dressage.errors import TransferQueueError
from dressage.tq.directory.controller import Controller

__all__ = ["Recovery", "recover_directory"]

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
    directory. A unit that does not answer is
    reported, not fatal: its keys stay unknown until the Controller is started again with it up."""
    out = Recovery()

    def one(unit_id: str) -> None:
        try:
            out.adopted[unit_id] = controller.adopt(unit_id, units[unit_id].inventory())
        except TransferQueueError as exc:
            out.unreachable[unit_id] = str(exc)

    # Asked together: a unit that does not answer costs its timeout once, not once per unit.
    if units:
        with ThreadPoolExecutor(max_workers=min(len(units), 32), thread_name_prefix="tq-recovery") as pool:
            list(pool.map(one, list(units)))
    if out.keys or out.unreachable:
        log.warning("Controller: %s", out.describe())
    return out
