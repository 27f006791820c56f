"""What the TransferQueue directory records: a key's state and entry, a StorageUnit's description
(``UnitInfo``, also its wire form) and its liveness. Plain data; the Controller owns the operations.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = ["Entry", "KeyState", "Liveness", "UnitInfo", "UnitState"]


class KeyState(str, enum.Enum):
    PENDING = "pending"      # placed, payload in flight to the unit
    WRITTEN = "written"      # durable in its unit
    CONSUMED = "consumed"    # read by a trainer at least once
    CLEARED = "cleared"      # removed (or queued for removal) from its unit


class UnitState(str, enum.Enum):
    LIVE = "live"    # answering (or never found otherwise)
    DEAD = "dead"    # its process exited, its actor died, or it answered no probe for unit_dead_after_s


@dataclass(slots=True)
class Liveness:
    state: UnitState
    since: float
    reason: str = ""
    last_seen: float | None = None


@dataclass(frozen=True, slots=True)
class UnitInfo:
    """A StorageUnit as the directory sees it: ``address`` its ZMQ endpoint, ``host_id`` / ``shm_token``
    for shared memory on its host, ``heartbeat`` the liveness probes' own endpoint (never delayed)."""

    unit_id: str
    node_id: str | None = None
    memory_budget: int = 4 << 30
    address: str | None = None
    host_id: str | None = None
    shm_token: str | None = None
    heartbeat: str | None = None
    head: bool = False
    """On the cluster's head node: it takes payload only when no unit elsewhere can (see ``Controller._choose``)."""

    def to_wire(self) -> dict[str, Any]:
        return {"unit_id": self.unit_id, "node_id": self.node_id, "memory_budget": self.memory_budget,
                "address": self.address, "host_id": self.host_id, "shm_token": self.shm_token,
                "heartbeat": self.heartbeat, "head": self.head}

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> "UnitInfo":
        return cls(unit_id=str(obj["unit_id"]), node_id=obj.get("node_id"),
                   memory_budget=int(obj.get("memory_budget", 4 << 30)), address=obj.get("address"),
                   host_id=obj.get("host_id"), shm_token=obj.get("shm_token"), heartbeat=obj.get("heartbeat"),
                   head=bool(obj.get("head", False)))


@dataclass(slots=True)
class Entry:
    unit_id: str
    nbytes: int
    batch: str | None
    field: str
    state: KeyState
    written_at: float
    touched_at: float
    adopted: bool = False
    """Taken from its unit's inventory by a restarted Controller; its writer's placement may still come."""
