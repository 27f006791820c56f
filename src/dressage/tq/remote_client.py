"""Build a TransferQueueClient from a client spec: the plain dict ``TransferQueue.client_spec()`` returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dressage.errors import ConfigError
from dressage.tq.controller import UnitInfo
from dressage.tq.controller_service import RemoteController
from dressage.tq.storage.remote import RemoteStorageUnit

__all__ = ["SPEC_VERSION", "make_spec", "connect_spec"]

SPEC_VERSION = 1


def make_spec(controller_address: str, units: list[UnitInfo], *, supports_spill: bool, timeout_s: float,
              on_full: str, full_wait_s: float, secret: bytes | None = None) -> dict[str, Any]:
    """The spec a client in another process connects with. With authentication on it carries the
    shared secret: hand it only to processes of this run (Ray actors, trainer ranks)."""
    spec = {
        "spec_version": SPEC_VERSION,
        "controller": controller_address,
        "units": [{**u.to_wire(), "supports_spill": supports_spill} for u in units],
        "request_timeout_s": timeout_s,
        "on_full": on_full,
        "full_wait_s": full_wait_s,
    }
    if secret is not None:
        spec["auth_secret"] = secret.decode()
    return spec


def connect_spec(cls: Any, spec: Mapping[str, Any], *, node_id: str | None = None) -> Any:
    if not isinstance(spec, Mapping) or spec.get("spec_version") != SPEC_VERSION:
        raise ConfigError(f"transfer_queue client spec: expected spec_version {SPEC_VERSION}, got {spec!r:.200}")
    timeout = float(spec.get("request_timeout_s", 30.0))
    secret = str(spec["auth_secret"]).encode() if spec.get("auth_secret") else None
    if node_id is None and spec.get("deployment") == "ray":
        from dressage.tq.ray_deploy import current_node_id

        node_id = current_node_id()  # a writer inside a Ray actor prefers its own node's unit
    controller = RemoteController(str(spec["controller"]), timeout_s=timeout, secret=secret)
    units = {}
    for u in spec["units"]:
        if not u.get("address"):
            raise ConfigError(f"transfer_queue client spec: unit {u.get('unit_id')!r} has no address")
        units[u["unit_id"]] = RemoteStorageUnit(
            u["unit_id"], u["address"], node_id=u.get("node_id"), memory_budget=int(u["memory_budget"]),
            timeout_s=timeout, supports_spill=bool(u.get("supports_spill")), host_id=u.get("host_id"),
            shm_token=u.get("shm_token"), secret=secret)
    return cls(controller, units, node_id=node_id, on_full=str(spec.get("on_full", "spill")),
               full_wait_s=float(spec.get("full_wait_s", 30.0)), owns_handles=True, spec=dict(spec))
