"""``ray`` deployment: one StorageUnit per node as Ray actors placed by node id, and the Controller.

Unit actors only start the ZMQ servers and report their addresses; payload bytes then move between
clients and units over ZMQ, never through the Ray object store. The Controller needs no Ray: it runs as
a child process of the driver, on the driver's node (``python -m dressage.tq.directory.main``), so
it carries neither a Ray worker's runtime nor its memory. Units go to the nodes other than the head
when there are any (``head_storage_unit``). Works on a single-machine Ray, on a
``ray.cluster_utils.Cluster`` and on a real cluster (set ``host: 0.0.0.0`` and a secret there). The
Controller probes the units; the driver also watches the unit actors and reports a dead one to the
Controller at once (``_ActorWatcher``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

from dressage.errors import ConfigError, StorageUnitUnavailable, TransferQueueError
from dressage.tq.client.client import TransferQueueClient
from dressage.tq.client.node import current_node_id
from dressage.tq.client.spec import make_spec
from dressage.tq.config import TransferQueueConfig
from dressage.tq.deploy.children import (ControllerSupervisor, controller_args, launch_child, read_ready,
                                         stop_children)
from dressage.tq.directory.entries import UnitInfo
from dressage.tq.directory.service import RemoteController
from dressage.tq.secret import DeploymentSecret
from dressage.tq.storage import StorageUnit
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.transport import shm

__all__ = ["RayDeployment", "current_node_id"]

log = logging.getLogger(__name__)

_WILDCARD_HOSTS = ("0.0.0.0", "::", "*")


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("transfer_queue.deployment: 'ray' needs the ray package (pip install 'dressage[ray]')") from exc
    return ray


def _advertised(host: str) -> str:
    if host in _WILDCARD_HOSTS:
        import ray

        return ray.util.get_node_ip_address()
    return host


class _UnitActor:
    """Runs a StorageUnit server in the actor's process; the actor itself carries no payload."""

    def __init__(self, unit_id: str, memory_budget: int, on_full: str, spill_dir: str | None, host: str,
                 port: int, shared_memory: bool, secret: bytes | None = None, checksums: bool = True,
                 metrics_port: int | None = None) -> None:
        import ray

        from dressage.tq.storage import make_storage_unit
        from dressage.tq.storage.server import StorageUnitServer

        node_id = ray.get_runtime_context().get_node_id()
        self.backend = make_storage_unit(unit_id, node_id=node_id, memory_budget=memory_budget,
                                         on_full=on_full, spill_dir=spill_dir, checksums=checksums)
        self.server = StorageUnitServer(self.backend, host=host, port=port, shared_memory=shared_memory,
                                        secret=secret, metrics_port=metrics_port).start()
        metrics = self.server.metrics_url
        self.info = {"unit_id": unit_id, "node_id": node_id, "memory_budget": memory_budget,
                     "address": f"tcp://{_advertised(host)}:{self.server.rpc.port}", "pid": os.getpid(),
                     "host_id": self.server.host_id,
                     "shm_token": self.server.shm.token if self.server.shm else None,
                     "heartbeat": f"tcp://{_advertised(host)}:{self.server.heartbeat.port}",
                     "metrics": None if metrics is None else
                     f"http://{_advertised(host)}:{metrics.rsplit(':', 1)[1]}"}

    def describe(self) -> dict[str, Any]:
        return self.info

    def stop(self) -> None:
        self.server.stop()
        self.backend.close()


def _is_head(node: dict[str, Any]) -> bool:
    """Whether a ``ray.nodes()`` entry is the head node (Ray gives it the ``node:__internal_head__`` resource)."""
    return bool(node.get("IsHead")) or "node:__internal_head__" in (node.get("Resources") or {})


def _unit_nodes(nodes: list[dict[str, Any]], heads: set[str], head_units: bool) -> list[dict[str, Any]]:
    """The nodes StorageUnits go to, in order: every node, or (``head_units`` false) the nodes other
    than the head whenever there are any, so the head holds no payload and runs no unit process."""
    others = [n for n in nodes if n["NodeID"] not in heads]
    return nodes if head_units or not others else others


class _ActorWatcher:
    """Keeps one ``describe`` call in flight per unit actor; a RayActorError means the actor died.

    A death is reported to the Controller until a report succeeds, and again to every Controller
    process started after it (``forget_reports``): a new one knows of no dead unit and would take it
    for live until its probes time out."""

    def __init__(self, actors: dict[str, Any], controller: Any, interval_s: float) -> None:
        self._actors = actors
        self._controller = controller
        self._interval = interval_s
        self._died: dict[str, str] = {}  # unit id -> why: never watched again
        self._reported: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tq-actor-watch", daemon=True)

    def start(self) -> "_ActorWatcher":
        self._thread.start()
        return self

    def unit_died(self, unit_id: str, reason: str) -> None:
        """Stop watching ``unit_id``'s actor; its death is reported from the next round on."""
        self._died[unit_id] = reason

    def forget_reports(self) -> None:
        """A new Controller process knows of no dead unit yet: report them all again."""
        self._reported = set()

    def _run(self) -> None:
        ray = _ray()
        pending: dict[str, Any] = {}
        while not self._stop.is_set():
            try:
                for uid, actor in self._actors.items():
                    if uid not in self._died and uid not in pending:
                        pending[uid] = actor.describe.remote()
                if pending:
                    # A stopped actor just stays pending here; the Controller's probes time it out.
                    ready, _ = ray.wait(list(pending.values()), num_returns=1, timeout=self._interval)
                    for uid, ref in list(pending.items()):
                        if ref not in ready:
                            continue
                        del pending[uid]
                        try:
                            ray.get(ref)
                        except ray.exceptions.RayActorError as exc:
                            self.unit_died(uid, f"Ray actor died: {type(exc).__name__}")
                self._report()
                self._stop.wait(self._interval)
            except Exception as exc:  # Ray shutting down; stop quietly
                if not self._stop.is_set():
                    log.debug("actor watcher: %s", exc)
                    self._stop.wait(self._interval)

    def _report(self) -> None:
        reported = self._reported  # forget_reports may start a new set meanwhile: that one is asked next round
        for uid, reason in list(self._died.items()):
            if uid in reported:
                continue
            try:
                self._controller.mark_unit_dead(uid, reason)
                reported.add(uid)
            except TransferQueueError:  # the Controller is busy, gone or starting again; next round
                pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._controller.close()


class RayDeployment:
    """One StorageUnit actor per node and the Controller as a child process of this driver."""

    def __init__(self, config: TransferQueueConfig) -> None:
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.config = config
        self._secret = DeploymentSecret(config)
        secret = self._secret.value
        self.secret_file = self._secret.path
        self._watcher: _ActorWatcher | None = None
        self._started_ray = False
        if not ray.is_initialized():
            ray.init(address=config.ray_address, include_dashboard=False)
            self._started_ray = True
        self._actors: list[Any] = []
        self._pids: dict[str, int] = {}
        self._metrics: dict[str, str] = {}
        try:
            nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: not _is_head(n))
            if not nodes:
                raise StorageUnitUnavailable("the Ray cluster has no alive nodes")
            here = ray.get_runtime_context().get_node_id()
            heads = {n["NodeID"] for n in nodes if _is_head(n)} or {here}  # else the Controller's node
            hosts = _unit_nodes(nodes, heads, config.head_storage_unit)
            count = config.num_storage_units or len(hosts)
            config.check_ports(count)  # one unit per node: known only now
            unit_cls = ray.remote(num_cpus=0)(_UnitActor)
            actors = []
            for i in range(count):
                node = hosts[i % len(hosts)]["NodeID"]
                port = config.unit_base_port + i if config.unit_base_port else 0
                actor = unit_cls.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
                ).remote(f"unit{i}", config.budget_bytes, config.on_full, config.spill_dir, config.host, port,
                         config.shared_memory, secret, config.checksums,
                         None if config.metrics_port is None else
                         config.metrics_port and config.metrics_port + 1 + i)
                actors.append(actor)
                self._actors.append(actor)
            # The Controller is a plain child process of this driver, on its node: it needs neither Ray
            # nor numpy's arrays, so it costs a third of a Ray actor's memory. It starts now, so its
            # imports overlap the units' start, and reads the units from its stdin once they are up.
            self._controller_proc = launch_child(controller_args(config, "-"), secret, stdin=True)
            described = self._wait([a.describe.remote() for a in actors], "StorageUnit actors")
            # Units on the head node are the placement's last resort once other nodes have units.
            spread = len({d["node_id"] for d in described}) > 1
            self._infos = [UnitInfo(d["unit_id"], d["node_id"], int(d["memory_budget"]), d["address"],
                                    host_id=d.get("host_id"), shm_token=d.get("shm_token"),
                                    heartbeat=d.get("heartbeat"), head=spread and d["node_id"] in heads)
                           for d in described]
            self._pids.update({d["unit_id"]: int(d["pid"]) for d in described})
            self._metrics = {d["unit_id"]: d["metrics"] for d in described if d.get("metrics")}
            address = self._start_controller([u.to_wire() for u in self._infos])
            self._supervisor = ControllerSupervisor(self._controller_proc, address, config,
                                                    json.dumps([u.to_wire() for u in self._infos]), secret,
                                                    on_restart=self._controller_restarted).start()
            self.controller = RemoteController(address, timeout_s=config.request_timeout_s, secret=secret)
            self._unit_actors = {d["unit_id"]: a for d, a in zip(described, actors)}
            self._watcher = _ActorWatcher(
                self._unit_actors, RemoteController(address, timeout_s=2.0, secret=secret),
                interval_s=min(config.heartbeat_interval_s, 0.5)).start()
        except BaseException:
            self.shutdown()
            raise
        self._units = {u.unit_id: RemoteStorageUnit(u.unit_id, u.address or "", node_id=u.node_id,
                                                    memory_budget=u.memory_budget,
                                                    timeout_s=config.request_timeout_s,
                                                    supports_spill=config.on_full == "spill",
                                                    host_id=u.host_id, shm_token=u.shm_token, secret=secret)
                       for u in self._infos}
        self._spec = make_spec(address, self._infos, supports_spill=config.on_full == "spill",
                               timeout_s=config.request_timeout_s, on_full=config.on_full,
                               full_wait_s=config.full_wait_s, secret=secret)
        self._spec["deployment"] = "ray"

    def _start_controller(self, units: list[dict[str, Any]]) -> str:
        """Hand the units to the Controller process, wait for its READY line; its advertised address."""
        proc = self._controller_proc
        try:
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(units) + "\n").encode())
            proc.stdin.close()
        except OSError:  # it exited already: await_ready reports how
            pass
        address, metrics = read_ready(proc, "Controller", self.config.startup_timeout_s)
        self._pids["controller"] = proc.pid
        if metrics is not None:
            host, _, port = metrics.removeprefix("http://").removesuffix("/metrics").rpartition(":")
            self._metrics["controller"] = f"http://{_advertised(host)}:{port}/metrics"
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        return f"tcp://{_advertised(host)}:{port}"

    def _controller_restarted(self, proc: Any) -> None:
        self._controller_proc = proc
        self._pids["controller"] = proc.pid
        if self._watcher is not None:
            self._watcher.forget_reports()

    @property
    def controller_restarts(self) -> int:
        """How many times the Controller process was started again."""
        supervisor = getattr(self, "_supervisor", None)
        return supervisor.restarts if supervisor is not None else 0

    def _wait(self, refs: list[Any], what: str) -> list[Any]:
        ray = _ray()
        try:
            return ray.get(refs, timeout=self.config.startup_timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise StorageUnitUnavailable(f"{what} did not start within {self.config.startup_timeout_s:g} s") from exc
        except ray.exceptions.RayError as exc:
            raise StorageUnitUnavailable(f"{what} failed to start: {exc}") from exc

    # docstrings inherited from tq/deploy/base.py:Deployment
    def client(self, node_id: str | None) -> TransferQueueClient:
        return TransferQueueClient(self.controller, self._units, node_id=node_id or current_node_id(),
                                   on_full=self.config.on_full, full_wait_s=self.config.full_wait_s)

    def client_spec(self) -> dict[str, Any]:
        return dict(self._spec)

    def unit_handles(self) -> dict[str, StorageUnit]:
        return dict(self._units)

    def unit_nodes(self) -> dict[str, str | None]:
        return {u.unit_id: u.node_id for u in self._infos}

    def metrics_urls(self) -> dict[str, str]:
        """The Prometheus endpoint of the Controller and of each StorageUnit actor that serves one."""
        return dict(self._metrics)

    def processes(self) -> dict[str, int]:
        return dict(self._pids)

    def run_janitor(self) -> int:
        return self.controller.run_janitor()

    @staticmethod
    def _stopped(ref: Any) -> bool:
        """Whether a finished ``stop`` call succeeded (an actor that had died answers with an error)."""
        try:
            _ray().get(ref)
            return True
        except Exception:
            return False

    @staticmethod
    def _remove_segments(infos: list[UnitInfo]) -> None:
        """Remove the /dev/shm segments of units that did not stop by themselves (dead, or killed while
        stuck), as the ``local`` deployment does; a unit on another host than this driver is out of reach."""
        here = shm.host_id()
        for info in infos:
            if info.shm_token and here is not None and info.host_id == here:
                n = shm.remove_segments(info.shm_token)
                if n:
                    log.info("removed %d /dev/shm segment(s) StorageUnit %s left behind", n, info.unit_id)

    def shutdown(self) -> None:
        ray = _ray()
        supervisor = getattr(self, "_supervisor", None)
        if supervisor is not None:
            supervisor.stop()  # first: a Controller stopped below must not be started again
        watcher = getattr(self, "_watcher", None)
        if watcher is not None:
            watcher.stop()
        for handle in getattr(self, "_units", {}).values():
            handle.close()
        controller = getattr(self, "controller", None)
        if controller is not None:
            controller.close()
        proc = getattr(self, "_controller_proc", None)
        if proc is not None:
            stop_children([proc])
        if ray.is_initialized() and self._actors:
            # Every survivor gets its stop (which removes its /dev/shm segments) before any kill: a
            # dead actor's stop fails at once and must not cut the others' short.
            stops = [a.stop.remote() for a in self._actors]
            stopped, _ = ray.wait(stops, num_returns=len(stops), timeout=10)
            for actor in self._actors:
                ray.kill(actor)
            self._remove_segments([info for info, ref in zip(getattr(self, "_infos", []), stops)
                                   if ref not in stopped or not self._stopped(ref)])
        self._actors.clear()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False
        self._secret.remove()
