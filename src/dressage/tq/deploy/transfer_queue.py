"""TransferQueue.start(config): bring up a deployment, hand out clients, shut down.

The deployment ``config.deployment`` names (``embedded``, ``local``, ``ray``, ``transferqueue``: one
module each under ``tq/deploy/``) is reached only through the ``Deployment`` protocol; clients look the same in all three.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Mapping

from dressage.errors import StorageUnitUnavailable, TransferQueueError
from dressage.tq.client.client import TransferQueueClient
from dressage.tq.config import TransferQueueConfig, check_spill_dir, load_config
from dressage.tq.deploy.base import Deployment
from dressage.tq.deploy.embedded import EmbeddedDeployment
from dressage.tq.directory.entries import UnitInfo
from dressage.tq.storage import StorageUnit

__all__ = ["TransferQueue", "start_deployment"]


def start_deployment(config: TransferQueueConfig) -> Deployment:
    """The deployment ``config.deployment`` names, started."""
    if config.deployment in ("embedded", "local") and config.on_full == "spill" and config.spill_dir is not None:
        check_spill_dir(config.spill_dir)  # this host's units spill there: refused before any starts
    if config.deployment == "embedded":
        return EmbeddedDeployment(config)
    # Imported when chosen: ``local`` brings ZMQ, ``ray`` brings Ray.
    if config.deployment == "local":
        from dressage.tq.deploy.local import LocalDeployment

        return LocalDeployment(config)
    if config.deployment == "transferqueue":  # brings Ray and the public TransferQueue
        from dressage.tq.deploy.kv import KVDeployment

        return KVDeployment(config)
    from dressage.tq.deploy.ray_actors import RayDeployment

    return RayDeployment(config)


class TransferQueue:
    """A running TransferQueue deployment. Use as a context manager or call :meth:`shutdown`."""

    def __init__(self, config: TransferQueueConfig, deployment: Deployment) -> None:
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
        return cls(config, start_deployment(config))

    @property
    def deployment(self) -> str:
        return self.config.deployment

    @property
    def secret_file(self) -> Any:
        """The 0600 file holding the secret this deployment generated (None when it was configured,
        or before an embedded deployment is served over ZMQ)."""
        return self._deployment.secret_file

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
        from dressage.tq.client.spec import write_client_spec  # the spec module imports ZMQ

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

    def metrics_urls(self) -> dict[str, str]:
        """The Prometheus ``/metrics`` URL of the Controller and of each StorageUnit process (``metrics_port``
        set; local and ray deployments). Empty otherwise: an embedded deployment's units are in the Proxy's."""
        self._check_open()
        return dict(getattr(self._deployment, "metrics_urls", dict)())

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
