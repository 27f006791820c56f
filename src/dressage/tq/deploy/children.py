"""Child processes of a deployment: start ``python -m ...`` with the secret in its environment, wait for
its ``READY <address> <pid>`` line, and stop it (terminate, then kill). Shared by the ``local`` and
``ray`` deployments, which both run the Controller as such a child and keep it running with a
:class:`ControllerSupervisor` (a Controller started again rebuilds its directory from the units).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from dressage.errors import StorageUnitUnavailable, TransferQueueError
from dressage.tq.config import SECRET_ENV, TransferQueueConfig
from dressage.tq.directory.janitor import sweep_interval

__all__ = ["launch_child", "await_ready", "read_ready", "spawn", "spawn_observed", "stop_children", "controller_args",
           "observe_args", "ControllerSupervisor"]

log = logging.getLogger(__name__)


def _child_env(secret: bytes | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(SECRET_ENV, None)
    if secret is not None:
        env[SECRET_ENV] = secret.decode()  # the environment, not argv: ps shows argv to everyone
    return env


def spawn(args: list[str], what: str, timeout_s: float, secret: bytes | None = None) -> tuple[subprocess.Popen, str]:
    """Start a child and wait for it to be ready: the process and its advertised address."""
    return await_ready(launch_child(args, secret), what, timeout_s)


def spawn_observed(args: list[str], what: str, timeout_s: float,
                   secret: bytes | None = None) -> tuple[subprocess.Popen, str, str | None]:
    """:func:`spawn`, with the metrics URL the child's READY line names (``None``: it serves none)."""
    proc = launch_child(args, secret)
    address, metrics = read_ready(proc, what, timeout_s)
    return proc, address, metrics


def launch_child(args: list[str], secret: bytes | None = None, *, stdin: bool = False) -> subprocess.Popen:
    """Start ``python -m args``; ``stdin`` keeps a pipe open to it (for input it reads before READY)."""
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, env=_child_env(secret))


def await_ready(proc: subprocess.Popen, what: str, timeout_s: float) -> tuple[subprocess.Popen, str]:
    """Wait for the child's ``READY <address> <pid>`` line; stop it and raise if it does not come."""
    return proc, read_ready(proc, what, timeout_s)[0]


def read_ready(proc: subprocess.Popen, what: str, timeout_s: float) -> tuple[str, str | None]:
    """The child's ``READY <address> <pid> [<metrics url>]`` line: its address and metrics URL."""
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
            if ready:  # end of its output: it exited by itself
                raise StorageUnitUnavailable(f"{what} process exited (exit code {proc.returncode})")
            raise StorageUnitUnavailable(f"{what} process was not ready within {timeout_s:g} s, the startup timeout "
                                         "(transfer_queue.startup_timeout_s); it was stopped")
        line += chunk
    parts = line.decode().split()
    if len(parts) not in (3, 4) or parts[0] != "READY":
        stop_children([proc])
        raise TransferQueueError(f"{what} process printed {line!r:.200} instead of READY")
    return parts[1], parts[3] if len(parts) == 4 else None


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
    args = ["dressage.tq.directory.main", "--units", units, "--host", config.host,
            "--port", str(config.controller_port), "--sweep-s", str(sweep_interval(config.retention_s)),
            "--timeout-s", str(config.request_timeout_s), "--heartbeat-s", str(config.heartbeat_interval_s),
            "--dead-after-s", str(config.unit_dead_after_s)]
    if config.retention_s is not None:
        args += ["--retention-s", str(config.retention_s)]
    if config.on_full != "spill":
        args.append("--strict-budget")
    return args + observe_args(config, None)


def observe_args(config: TransferQueueConfig, unit_index: int | None) -> list[str]:
    """The metrics and log flags of the Controller (``unit_index`` ``None``) or of StorageUnit ``unit_index``."""
    args = ["--log-format", config.log_format] if config.log_format != "text" else []
    if config.metrics_port is not None:
        port = config.metrics_port if not config.metrics_port or unit_index is None \
            else config.metrics_port + 1 + unit_index
        args += ["--metrics-port", str(port)]
    return args


class ControllerSupervisor:
    """Starts the Controller process again, on the port it had, whenever it exits: clients' sockets
    reconnect by themselves, and the new process adopts every key its units hold before it serves.
    ``on_restart(proc)`` runs after each restart (the deployment records the new pid)."""

    def __init__(self, proc: subprocess.Popen, address: str, config: TransferQueueConfig, units: str,
                 secret: bytes | None, on_restart: Callable[[subprocess.Popen], None] | None = None,
                 interval_s: float = 0.05) -> None:
        port = int(address.rsplit(":", 1)[1])
        self.proc = proc
        self.restarts = 0
        self._args = controller_args(config.replace(controller_port=port), units)
        self._timeout_s = config.startup_timeout_s
        self._secret = secret
        self._on_restart = on_restart
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tq-controller-watch", daemon=True)

    def start(self) -> "ControllerSupervisor":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if self.proc.poll() is None:
                continue
            log.warning("the Controller process %d exited with code %s; starting it again",
                        self.proc.pid, self.proc.returncode)
            stop_children([self.proc])  # closes its pipes
            try:
                proc, _ = spawn(self._args, "Controller", self._timeout_s, self._secret)
            except TransferQueueError as exc:
                log.error("the Controller could not be started again: %s", exc)
                continue
            if self._stop.is_set():  # the deployment shut down meanwhile: this one goes too
                stop_children([proc])
                return
            self.proc = proc
            self.restarts += 1
            if self._on_restart is not None:
                self._on_restart(proc)

    def stop(self) -> None:
        """Stop watching (before the deployment stops the Controller itself)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._timeout_s + 5)
