"""``local`` deployment: the Controller and each StorageUnit as separate processes on this host.

Children are started with the current interpreter, report ``READY <address> <pid>`` on stdout, exit when
this process dies, and are terminated (then killed) on shutdown. A unit process that exits is reported
to the Controller as dead at once (``_ExitWatcher``); one that stops answering is found by the
Controller's probes. Also: ``expose_embedded`` serves an embedded deployment over ZMQ threads so other
processes can connect to it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from dressage.errors import StorageUnitUnavailable, TransferQueueError
from dressage.tq.transport import shm
from dressage.tq.client.client import TransferQueueClient
from dressage.tq.config import SECRET_ENV, TransferQueueConfig
from dressage.tq.directory.controller import Controller, UnitInfo
from dressage.tq.directory.service import ControllerServer, RemoteController
from dressage.tq.client.spec import make_spec
from dressage.tq.secret import DeploymentSecret
from dressage.tq.storage import StorageUnit
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.storage.server import StorageUnitServer

__all__ = ["LocalDeployment", "expose_embedded", "EmbeddedServers"]


def _child_env(secret: bytes | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(SECRET_ENV, None)
    if secret is not None:
        env[SECRET_ENV] = secret.decode()  # the environment, not argv: ps shows argv to everyone
    return env


def _spawn(args: list[str], what: str, timeout_s: float, secret: bytes | None = None) -> tuple[subprocess.Popen, str]:
    return await_ready(launch_child(args, secret), what, timeout_s)


def launch_child(args: list[str], secret: bytes | None = None, *, stdin: bool = False) -> subprocess.Popen:
    """Start ``python -m args``; ``stdin`` keeps a pipe open to it (for input it reads before READY)."""
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, env=_child_env(secret))


def await_ready(proc: subprocess.Popen, what: str, timeout_s: float) -> tuple[subprocess.Popen, str]:
    """Wait for the child's ``READY <address> <pid>`` line; stop it and raise if it does not come."""
    deadline = time.monotonic() + timeout_s
    line = b""
    if proc.stdout is None:
        raise TransferQueueError(f"{what} process has no stdout pipe")
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stdout], [], [], max(left, 0))
        chunk = os.read(proc.stdout.fileno(), 4096) if ready else b""
        if not chunk:
            stop_children([proc])
            why = "exited" if proc.poll() is not None else f"not ready within {timeout_s:g} s"
            raise StorageUnitUnavailable(f"{what} process {why} (exit code {proc.returncode})")
        line += chunk
    parts = line.decode().split()
    if len(parts) != 3 or parts[0] != "READY":
        stop_children([proc])
        raise TransferQueueError(f"{what} process printed {line!r:.200} instead of READY")
    return proc, parts[1]


def stop_children(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        for pipe in (p.stdout, p.stdin):
            if pipe is not None:
                pipe.close()


def controller_args(config: TransferQueueConfig, units: str) -> list[str]:
    """``python -m`` arguments of a Controller process for ``config``; ``units`` is the JSON list of
    unit descriptions, or ``-`` to hand it over on the process's stdin."""
    from dressage.tq.deploy.transfer_queue import sweep_interval

    args = ["dressage.tq.directory.main", "--units", units, "--host", config.host,
            "--port", str(config.controller_port), "--sweep-s", str(sweep_interval(config)),
            "--timeout-s", str(config.request_timeout_s), "--heartbeat-s", str(config.heartbeat_interval_s),
            "--dead-after-s", str(config.unit_dead_after_s)]
    if config.retention_s is not None:
        args += ["--retention-s", str(config.retention_s)]
    if config.on_full != "spill":
        args.append("--strict-budget")
    return args


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
    def __init__(self, config: TransferQueueConfig) -> None:
        self.config = config
        self._secret = DeploymentSecret(config)
        secret = self._secret.value
        self.secret_file = self._secret.path
        self._watcher: _ExitWatcher | None = None
        self._procs: dict[str, subprocess.Popen] = {}
        self._units: dict[str, RemoteStorageUnit] = {}
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
                proc, address = _spawn(args, f"StorageUnit {uid}", config.startup_timeout_s, secret)
                self._procs[uid] = proc
                handle = RemoteStorageUnit.describe(uid, address, timeout_s=config.request_timeout_s, secret=secret)
                self._units[uid] = handle
                infos.append(UnitInfo(uid, None, config.budget_bytes, address, host_id=handle.host_id,
                                      shm_token=handle.shm_token, heartbeat=handle.heartbeat))
            args = controller_args(config, json.dumps([u.to_wire() for u in infos]))
            proc, address = _spawn(args, "Controller", config.startup_timeout_s, secret)
            self._procs["controller"] = proc
            self.controller = RemoteController(address, timeout_s=config.request_timeout_s, secret=secret)
            # Its own directory handle: a watcher report never waits behind a client's call.
            self._watcher = _ExitWatcher(self._procs, RemoteController(address, timeout_s=2.0, secret=secret)).start()
        except BaseException:
            self.shutdown()
            raise
        self._infos = infos
        self._spec = make_spec(address, infos, supports_spill=config.on_full == "spill",
                               timeout_s=config.request_timeout_s, on_full=config.on_full,
                               full_wait_s=config.full_wait_s, secret=secret)

    def client(self, node_id: str | None) -> TransferQueueClient:
        return TransferQueueClient(self.controller, self._units, node_id=node_id, on_full=self.config.on_full,
                                   full_wait_s=self.config.full_wait_s)

    def client_spec(self) -> dict[str, Any]:
        return dict(self._spec)

    def unit_handles(self) -> dict[str, StorageUnit]:
        return dict(self._units)

    def processes(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._procs.items()}

    def run_janitor(self) -> int:
        return self.controller.run_janitor()

    def shutdown(self) -> None:
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
        stop_children(list(self._procs.values()))
        self._procs.clear()
        for info in getattr(self, "_infos", []):
            if info.shm_token:
                shm.remove_segments(info.shm_token)  # whatever a killed unit left behind
        self._secret.remove()


class EmbeddedServers:
    """ZMQ servers (threads of this process) over an embedded deployment's own objects."""

    def __init__(self, config: TransferQueueConfig, controller: Controller, units: dict[str, StorageUnit]) -> None:
        self._servers: list[Any] = []
        infos = []
        self._secret = DeploymentSecret(config)
        secret = self._secret.value
        self.secret_file = self._secret.path
        try:
            for i, (uid, unit) in enumerate(units.items()):
                port = config.unit_base_port + i if config.unit_base_port else 0
                server = StorageUnitServer(unit, host=config.host, port=port,
                                           shared_memory=config.shared_memory, secret=secret).start()
                self._servers.append(server)
                infos.append(UnitInfo(uid, unit.node_id, unit.memory_budget, server.address,
                                      host_id=server.host_id, shm_token=server.shm.token if server.shm else None,
                                      heartbeat=server.heartbeat.address))
            ctl = ControllerServer(controller, host=config.host, port=config.controller_port, secret=secret).start()
            self._servers.append(ctl)
        except BaseException:
            self.close()
            raise
        self.spec = make_spec(ctl.address, infos, supports_spill=config.on_full == "spill",
                              timeout_s=config.request_timeout_s, on_full=config.on_full,
                              full_wait_s=config.full_wait_s, secret=secret)

    def close(self) -> None:
        for server in self._servers:
            server.stop()
        self._servers.clear()
        self._secret.remove()


def expose_embedded(config: TransferQueueConfig, controller: Controller,
                    units: dict[str, StorageUnit]) -> EmbeddedServers:
    return EmbeddedServers(config, controller, units)
