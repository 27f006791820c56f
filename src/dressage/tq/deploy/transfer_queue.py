"""TransferQueue.start(config): bring up a Controller and StorageUnits, hand out clients, shut down.

``embedded`` keeps everything in this process (ZMQ servers start only if ``client_spec()`` is asked for,
so other processes can join); ``local`` runs the Controller and each StorageUnit as processes on this host;
``ray`` runs them as Ray actors, one StorageUnit per node. Clients look the same in all three.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Mapping

from dressage.errors import StorageUnitUnavailable, TransferQueueError
from dressage.tq.client.client import TransferQueueClient
from dressage.tq.config import TransferQueueConfig, load_config
from dressage.tq.directory.controller import Controller, UnitInfo
from dressage.tq.directory.janitor import Janitor
from dressage.tq.storage import StorageUnit, make_storage_unit

__all__ = ["TransferQueue", "sweep_interval"]

log = logging.getLogger(__name__)
SPEC_VERSION = 1


def sweep_interval(config: TransferQueueConfig) -> float:
    """How often the janitor runs: often enough for retention and queued deletes, never busy."""
    if config.retention_s is None:
        return 1.0
    return min(max(config.retention_s / 10.0, 0.05), 5.0)


class TransferQueue:
    """A running TransferQueue deployment. Use as a context manager or call :meth:`shutdown`."""

    def __init__(self, config: TransferQueueConfig, deployment: Any) -> None:
        self.config = config
        self._deployment = deployment
        self._clients: list[TransferQueueClient] = []
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def start(cls, config: "TransferQueueConfig | Mapping[str, Any] | str | os.PathLike[str] | None" = None,
              ) -> "TransferQueue":
        """Start the deployment ``config.deployment`` names (a config, mapping, YAML path or None)."""
        config = load_config(config)
        if config.deployment == "embedded":
            deployment: Any = _Embedded(config)
        elif config.deployment == "local":
            from dressage.tq.deploy.local import LocalDeployment

            deployment = LocalDeployment(config)
        else:
            from dressage.tq.deploy.ray_actors import RayDeployment

            deployment = RayDeployment(config)
        return cls(config, deployment)

    @property
    def deployment(self) -> str:
        return self.config.deployment

    @property
    def secret_file(self) -> Any:
        """The 0600 file holding the secret this deployment generated (None when it was configured,
        or before an embedded deployment is served over ZMQ)."""
        servers = getattr(self._deployment, "_servers", None)
        return getattr(self._deployment, "secret_file", None) or getattr(servers, "secret_file", None)

    def client(self, node_id: str | None = None) -> TransferQueueClient:
        """A client in this process; ``node_id`` makes writes prefer StorageUnits on that node."""
        self._check_open()
        client = self._deployment.client(node_id)
        with self._lock:
            self._clients.append(client)
        return client

    def client_spec(self) -> dict[str, Any]:
        """A small msgpack-able dict; ``TransferQueueClient.connect(spec)`` joins from another process."""
        self._check_open()
        return self._deployment.client_spec()

    def write_client_spec(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`client_spec` to ``path`` (JSON, mode 0600) for a process that joins later, e.g.
        a Proxy run as its own service: ``dressage proxy serve --transfer-queue-spec path``."""
        from dressage.tq.client.spec import write_client_spec

        write_client_spec(self.client_spec(), path)

    @property
    def controller(self) -> Any:
        """The directory handle (in-process Controller or its remote twin)."""
        return self._deployment.controller

    def units(self) -> list[UnitInfo]:
        return self._deployment.controller.units()

    def storage_units(self) -> dict[str, StorageUnit]:
        """``{unit_id: StorageUnit}``: the backends themselves (embedded) or their ZMQ handles (local, ray)."""
        self._check_open()
        return dict(self._deployment.unit_handles())

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per unit: what the unit holds (keys, bytes, memory_bytes, held_bytes, peak_held_bytes,
        spilled_bytes, counters) merged with the Controller's view (state: live|dead, state_reason,
        directory_keys, pending, queued_deletes). A dead unit is not asked (it would not answer)."""
        self._check_open()
        directory = self._deployment.controller.stats()
        out = {}
        for unit_id, unit in self._deployment.unit_handles().items():
            if directory.get(unit_id, {}).get("state") == "dead":
                row = {"unit_id": unit_id, "available": False,
                       "error": f"StorageUnit {unit_id} is dead: {directory[unit_id].get('state_reason', '')}"}
            else:
                try:
                    row = {"available": True, **unit.stats()}
                except StorageUnitUnavailable as exc:  # one dead unit must not hide the others
                    row = {"unit_id": unit_id, "available": False, "error": str(exc)}
            row.update(directory.get(unit_id, {}))
            out[unit_id] = row
        return out

    def total_keys(self) -> int:
        """Keys stored across every unit, counted by the units themselves (raises if one is down)."""
        total = 0
        for unit_id, row in self.stats().items():
            if not row["available"]:
                raise StorageUnitUnavailable(f"cannot count keys of unit {unit_id}: {row['error']}")
            total += int(row["keys"])
        return total

    def processes(self) -> dict[str, int]:
        """``{component: pid}`` of the processes holding TQ state (for PSS measurement)."""
        return self._deployment.processes()

    def run_janitor(self) -> int:
        """Run one retention sweep and queued deletion pass now; returns keys removed from units."""
        return self._deployment.run_janitor()

    def unit_states(self) -> dict[str, dict[str, Any]]:
        """``{unit_id: {"state": "live"|"dead", "for_s", "reason", "seen_s_ago"}}`` from the Controller."""
        self._check_open()
        return self._deployment.controller.unit_states()

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
        self._deployment.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise TransferQueueError("the TransferQueue was shut down")

    def __enter__(self) -> "TransferQueue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __del__(self) -> None:  # processes must not outlive a forgotten handle
        try:
            self.shutdown()
        except Exception:
            pass


class _Embedded:
    """Everything in this process; units are in-process backends."""

    def __init__(self, config: TransferQueueConfig) -> None:
        self.config = config
        n = config.num_storage_units or 1
        self.units: dict[str, StorageUnit] = {}
        for i in range(n):
            uid = f"unit{i}"
            self.units[uid] = make_storage_unit(uid, node_id=None, memory_budget=config.budget_bytes,
                                                on_full=config.on_full, spill_dir=config.spill_dir,
                                                checksums=config.checksums,
                                                verify_local_reads=config.verify_local_reads)
        self.controller = Controller(
            [UnitInfo(uid, None, config.budget_bytes) for uid in self.units], retention_s=config.retention_s,
            strict_budget=config.on_full != "spill")
        self.janitor = Janitor(self.controller, self.units.get, interval_s=sweep_interval(config)).start()
        self._servers: Any = None

    def client(self, node_id: str | None) -> TransferQueueClient:
        return TransferQueueClient(self.controller, self.units, node_id=node_id, on_full=self.config.on_full,
                                   full_wait_s=self.config.full_wait_s)

    def client_spec(self) -> dict[str, Any]:
        if self._servers is None:
            from dressage.tq.deploy.local import expose_embedded

            self._servers = expose_embedded(self.config, self.controller, self.units)
        return self._servers.spec

    def unit_handles(self) -> dict[str, StorageUnit]:
        return self.units

    def processes(self) -> dict[str, int]:
        return {"tq": os.getpid()}

    def run_janitor(self) -> int:
        return self.janitor.run_once()

    def shutdown(self) -> None:
        self.janitor.stop()
        if self._servers is not None:
            self._servers.close()
        for unit in self.units.values():
            unit.close()
