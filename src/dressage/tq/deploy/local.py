"""``local`` deployment: the Controller and each StorageUnit as separate processes on this host.

Children are started with the current interpreter (``tq/deploy/children.py``), exit when this process
dies, and are terminated (then killed) on shutdown. A unit process that exits is reported to the
Controller as dead at once (``_ExitWatcher``); one that stops answering is found by the Controller's probes.
A Controller process that exits is started again on its port and rebuilds its directory from the units.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from typing import Any

from dressage.errors import TransferQueueError
from dressage.tq.client.client import TransferQueueClient
from dressage.tq.client.spec import make_spec
from dressage.tq.config import TransferQueueConfig
from dressage.tq.deploy.children import (ControllerSupervisor, controller_args, observe_args, spawn_observed,
                                         stop_children)
from dressage.tq.directory.entries import UnitInfo
from dressage.tq.directory.service import RemoteController
from dressage.tq.secret import DeploymentSecret
from dressage.tq.storage import StorageUnit
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.transport import shm

__all__ = ["LocalDeployment"]


class _ExitWatcher:
    """Polls the unit processes; tells the Controller the moment one exits (killed, crashed, OOM)."""

    def __init__(self, procs: dict[str, subprocess.Popen], controller: Any, interval_s: float = 0.05) -> None:
        self._procs = {u: p for u, p in procs.items() if u != "controller"}
        self._controller = controller
        self._interval = interval_s
        self._stop = threading.Event()
        self._reported: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="tq-exit-watch", daemon=True)

    def start(self) -> "_ExitWatcher":
        self._thread.start()
        return self

    def forget_reports(self) -> None:
        """A new Controller process knows of no dead unit yet: report them all again."""
        self._reported = set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            for uid, proc in self._procs.items():
                if uid in self._reported or proc.poll() is None:
                    continue
                try:
                    self._controller.mark_unit_dead(uid, f"process {proc.pid} exited with code {proc.returncode}")
                    self._reported.add(uid)
                except TransferQueueError:  # the Controller is busy or gone; try again next round
                    pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._controller.close()


class LocalDeployment:
    """The Controller and one process per StorageUnit on this host, reached over ZMQ."""

    def __init__(self, config: TransferQueueConfig) -> None:
        self.config = config
        self._secret = DeploymentSecret(config)
        secret = self._secret.value
        self.secret_file = self._secret.path
        self._watcher: _ExitWatcher | None = None
        self._procs: dict[str, subprocess.Popen] = {}
        self._units: dict[str, RemoteStorageUnit] = {}
        self._metrics: dict[str, str] = {}
        infos: list[UnitInfo] = []
        self._infos = infos
        try:
            for i in range(config.num_storage_units or 1):
                uid = f"unit{i}"
                args = ["dressage.tq.storage.server", "--unit-id", uid, "--host", config.host,
                        "--port", str(config.unit_base_port + i if config.unit_base_port else 0),
                        "--memory-budget", str(config.budget_bytes), "--on-full", config.on_full]
                if config.spill_dir:
                    args += ["--spill-dir", config.spill_dir]
                if not config.shared_memory:
                    args.append("--no-shared-memory")
                if not config.checksums:
                    args.append("--no-checksums")
                args += observe_args(config, i)
                proc, address, metrics = spawn_observed(args, f"StorageUnit {uid}", config.startup_timeout_s, secret)
                self._procs[uid] = proc
                if metrics is not None:
                    self._metrics[uid] = metrics
                handle = RemoteStorageUnit.describe(uid, address, timeout_s=config.request_timeout_s, secret=secret)
                self._units[uid] = handle
                infos.append(UnitInfo(uid, None, config.budget_bytes, address, host_id=handle.host_id,
                                      shm_token=handle.shm_token, heartbeat=handle.heartbeat))
            args = controller_args(config, json.dumps([u.to_wire() for u in infos]))
            proc, address, metrics = spawn_observed(args, "Controller", config.startup_timeout_s, secret)
            self._procs["controller"] = proc
            if metrics is not None:
                self._metrics["controller"] = metrics
            self.controller = RemoteController(address, timeout_s=config.request_timeout_s, secret=secret)
            # Its own directory handle: a watcher report never waits behind a client's call.
            self._watcher = _ExitWatcher(self._procs, RemoteController(address, timeout_s=2.0, secret=secret)).start()
            self._supervisor = ControllerSupervisor(proc, address, config, json.dumps([u.to_wire() for u in infos]),
                                                    secret, on_restart=self._controller_restarted).start()
        except BaseException:
            self.shutdown()
            raise
        self._infos = infos
        self._spec = make_spec(address, infos, supports_spill=config.on_full == "spill",
                               timeout_s=config.request_timeout_s, on_full=config.on_full,
                               full_wait_s=config.full_wait_s, secret=secret)

    def _controller_restarted(self, proc: subprocess.Popen) -> None:
        self._procs["controller"] = proc
        if self._watcher is not None:
            self._watcher.forget_reports()

    @property
    def controller_restarts(self) -> int:
        """How many times the Controller process was started again."""
        supervisor = getattr(self, "_supervisor", None)
        return supervisor.restarts if supervisor is not None else 0

    # docstrings inherited from tq/deploy/base.py:Deployment
    def client(self, node_id: str | None) -> TransferQueueClient:
        return TransferQueueClient(self.controller, self._units, node_id=node_id, on_full=self.config.on_full,
                                   full_wait_s=self.config.full_wait_s)

    def client_spec(self) -> dict[str, Any]:
        return dict(self._spec)

    def unit_handles(self) -> dict[str, StorageUnit]:
        return dict(self._units)

    def metrics_urls(self) -> dict[str, str]:
        """The Prometheus endpoint of each process (``controller``, ``unit0``, ...) that serves one."""
        return dict(self._metrics)

    def processes(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._procs.items()}

    def run_janitor(self) -> int:
        return self.controller.run_janitor()

    def shutdown(self) -> None:
        supervisor = getattr(self, "_supervisor", None)
        if supervisor is not None:
            supervisor.stop()  # first: a Controller stopped below must not be started again
        watcher = getattr(self, "_watcher", None)
        if watcher is not None:
            watcher.stop()
        for proc in self._procs.values():
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGCONT)  # a stopped child cannot act on SIGTERM
                except ProcessLookupError:
                    pass
        for unit in self._units.values():
            unit.close()
        controller = getattr(self, "controller", None)
        if controller is not None:
            controller.close()
        # The Controller first: its janitor must not be deleting on units that are going away (each would
        # be a failed delete, logged as a warning on every ordinary shutdown).
        stop_children([p for name, p in self._procs.items() if name == "controller"])
        stop_children([p for name, p in self._procs.items() if name != "controller"])
        self._procs.clear()
        for info in getattr(self, "_infos", []):
            if info.shm_token:
                shm.remove_segments(info.shm_token)  # whatever a killed unit left behind
        self._secret.remove()
