"""``embedded`` deployment: the Controller, the StorageUnits and the Janitor in this process.

Clients here use the in-process objects themselves. ZMQ servers over those same objects start only when
``client_spec()`` is first asked for (``EmbeddedServers``), so processes started later can join.
"""

from __future__ import annotations

import os
from typing import Any

from dressage.tq.client.client import TransferQueueClient
from dressage.tq.config import TransferQueueConfig
from dressage.tq.directory.controller import Controller
from dressage.tq.directory.entries import UnitInfo
from dressage.tq.directory.janitor import Janitor, sweep_interval
from dressage.tq.secret import DeploymentSecret
from dressage.tq.storage import StorageUnit, make_storage_unit

__all__ = ["EmbeddedDeployment", "EmbeddedServers"]


class EmbeddedDeployment:
    """Everything in this process; units are in-process backends.

    ``units``: StorageUnits built elsewhere to run here instead of the configured in-process backends
    (the ``transferqueue`` deployment's one unit over the public TransferQueue); the Controller, Janitor and
    on-demand servers are the same over them. ``fast_writes`` as :class:`TransferQueueClient` takes it.
    """

    def __init__(self, config: TransferQueueConfig, *, units: dict[str, StorageUnit] | None = None,
                 fast_writes: bool = True) -> None:
        self.config = config
        self.fast_writes = fast_writes
        self.units: dict[str, StorageUnit] = units if units is not None else _memory_units(config)
        self.controller = Controller(
            [UnitInfo(uid, None, config.budget_bytes) for uid in self.units], retention_s=config.retention_s,
            strict_budget=config.on_full != "spill")
        self.janitor = Janitor(self.controller, self.units.get,
                               interval_s=sweep_interval(config.retention_s)).start()
        self.servers: EmbeddedServers | None = None

    # docstrings inherited from tq/deploy/base.py:Deployment
    @property
    def secret_file(self) -> Any:
        return None if self.servers is None else self.servers.secret_file

    def client(self, node_id: str | None) -> TransferQueueClient:
        return TransferQueueClient(self.controller, self.units, node_id=node_id, on_full=self.config.on_full,
                                   full_wait_s=self.config.full_wait_s, fast_writes=self.fast_writes)

    def client_spec(self) -> dict[str, Any]:
        if self.servers is None:
            self.servers = EmbeddedServers(self.config, self.controller, self.units)
        return self.servers.spec

    def unit_handles(self) -> dict[str, StorageUnit]:
        return self.units

    def processes(self) -> dict[str, int]:
        return {"tq": os.getpid()}

    def run_janitor(self) -> int:
        return self.janitor.run_once()

    def shutdown(self) -> None:
        self.janitor.stop()
        if self.servers is not None:
            self.servers.close()
        for unit in self.units.values():
            unit.close()


def _memory_units(config: TransferQueueConfig) -> dict[str, StorageUnit]:
    """The configured in-process backends (``unit0`` ...)."""
    return {f"unit{i}": make_storage_unit(f"unit{i}", node_id=None, memory_budget=config.budget_bytes,
                                          on_full=config.on_full, spill_dir=config.spill_dir,
                                          checksums=config.checksums, verify_local_reads=config.verify_local_reads)
            for i in range(config.num_storage_units or 1)}


class EmbeddedServers:
    """ZMQ servers (threads of this process) over an embedded deployment's own objects."""

    def __init__(self, config: TransferQueueConfig, controller: Controller, units: dict[str, StorageUnit]) -> None:
        # The servers import ZMQ: only a deployment that is asked to serve other processes pays for it.
        from dressage.tq.client.spec import make_spec
        from dressage.tq.directory.service import ControllerServer
        from dressage.tq.storage.server import StorageUnitServer

        self.servers: list[Any] = []
        infos = []
        self._secret = DeploymentSecret(config)
        secret = self._secret.value
        self.secret_file = self._secret.path
        try:
            for i, (uid, unit) in enumerate(units.items()):
                port = config.unit_base_port + i if config.unit_base_port else 0
                server = StorageUnitServer(unit, host=config.host, port=port,
                                           shared_memory=config.shared_memory, secret=secret).start()
                self.servers.append(server)
                infos.append(UnitInfo(uid, unit.node_id, unit.memory_budget, server.address,
                                      host_id=server.host_id, shm_token=server.shm.token if server.shm else None,
                                      heartbeat=server.heartbeat.address))
            ctl = ControllerServer(controller, host=config.host, port=config.controller_port, secret=secret).start()
            self.servers.append(ctl)
        except BaseException:
            self.close()
            raise
        self.spec = make_spec(ctl.address, infos, supports_spill=config.on_full == "spill",
                              timeout_s=config.request_timeout_s, on_full=config.on_full,
                              full_wait_s=config.full_wait_s, secret=secret)

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers.clear()
        self._secret.remove()
