"""Build a TransferQueueClient from a client spec: the plain dict ``TransferQueue.client_spec()`` returns."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from dressage.errors import ConfigError
from dressage.tq.client.node import current_node_id
from dressage.tq.directory.entries import UnitInfo
from dressage.tq.directory.service import RemoteController
from dressage.tq.storage.remote import RemoteStorageUnit

__all__ = ["SPEC_VERSION", "make_spec", "connect_spec", "write_client_spec", "load_client_spec"]

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


def connect_spec(cls: Any, spec: Mapping[str, Any], *, node_id: str | None = None, **client_options: Any) -> Any:
    """A ``cls`` (TransferQueueClient) over ZMQ handles of the spec's Controller and units;
    ``client_options`` go to its constructor."""
    if not isinstance(spec, Mapping) or spec.get("spec_version") != SPEC_VERSION:
        raise ConfigError(f"transfer_queue client spec: expected spec_version {SPEC_VERSION}, got {spec!r:.200}")
    timeout = float(spec.get("request_timeout_s", 30.0))
    secret = str(spec["auth_secret"]).encode() if spec.get("auth_secret") else None
    if node_id is None and spec.get("deployment") == "ray":
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
               full_wait_s=float(spec.get("full_wait_s", 30.0)), owns_handles=True, spec=dict(spec),
               **client_options)


def write_client_spec(spec: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a client spec as a JSON file only its owner can read (it carries the TQ's secret when the
    TQ has one), replacing ``path`` at once, so a process that starts later joins with
    :func:`load_client_spec` (``dressage proxy serve --transfer-queue-spec FILE``)."""
    if not isinstance(spec, Mapping) or spec.get("spec_version") != SPEC_VERSION:
        raise ConfigError(f"write_client_spec: not a TransferQueue client spec (spec_version {SPEC_VERSION})")
    tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(dict(spec), f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_client_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The client spec :func:`write_client_spec` wrote; a missing, unreadable or foreign file is a
    ConfigError that names it."""
    try:
        with open(path) as f:
            spec = json.load(f)
    except OSError as exc:
        raise ConfigError(f"TransferQueue client spec {os.fspath(path)!r}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"TransferQueue client spec {os.fspath(path)!r} is not JSON: {exc}") from None
    if not isinstance(spec, dict) or spec.get("spec_version") != SPEC_VERSION or not spec.get("controller"):
        raise ConfigError(f"TransferQueue client spec {os.fspath(path)!r}: not a spec of version {SPEC_VERSION} "
                          "(write it with TransferQueue.write_client_spec)")
    return spec
