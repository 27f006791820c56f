"""Baselines that cross (simulated) nodes: the Ray object store and the public ``transferqueue``.

Both run on one two-node ``ray.cluster_utils.Cluster``: the writer is an actor on node 0, the reader an
actor on node 1, which is what a trainer sees when the rollout side and the trainer live on different
hosts. Each actor times its own call, so Ray's actor-call latency is not charged to the system.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from dressage_bench._systems import BenchSystem, SystemUnavailable, Workload, make_items
from dressage_bench._timing import RoundTiming, Stopwatch

__all__ = ["BenchCluster", "RayObjectStoreSystem", "TransferQueueSystem"]

MiB = 1 << 20
# One call of any actor method in a timed round may take this long before the system is declared hung.
_CALL_TIMEOUT_S = 120.0
# Prefix of the custom resource that pins an actor to simulated node i.
NODE_RESOURCE = "dressage_bench_node"


def _ray():
    try:
        import ray
        from ray.cluster_utils import Cluster  # noqa: F401  (fails on a minimal ray install)
    except ImportError as exc:
        raise SystemUnavailable(f"ray is not installed ({exc}); pip install 'dressage[ray]'") from exc
    return ray


class BenchCluster:
    """A two-node simulated Ray cluster, started on first use and shared by every Ray-based system."""

    def __init__(self, object_store_bytes: int, num_nodes: int = 2) -> None:
        self.object_store_bytes = int(object_store_bytes)
        self.num_nodes = num_nodes
        self._cluster: Any = None
        self._error: str | None = None

    @property
    def running(self) -> bool:
        return self._cluster is not None

    def ensure_started(self) -> None:
        if self._cluster is not None:
            return
        if self._error is not None:
            raise SystemUnavailable(self._error)
        ray = _ray()
        if ray.is_initialized():
            self._error = "Ray is already initialised in this process; the bench needs its own cluster"
            raise SystemUnavailable(self._error)
        from ray.cluster_utils import Cluster

        try:
            cluster = Cluster(
                initialize_head=True,
                head_node_args={
                    "num_cpus": 1,
                    "resources": {f"{NODE_RESOURCE}0": 100},
                    "object_store_memory": self.object_store_bytes,
                    "include_dashboard": False,
                },
            )
            for i in range(1, self.num_nodes):
                cluster.add_node(
                    num_cpus=1,
                    resources={f"{NODE_RESOURCE}{i}": 100},
                    object_store_memory=self.object_store_bytes,
                )
            # Workers' logs (transferqueue warnings, Ray chatter) stay out of the bench's table.
            ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False,
                     logging_level="ERROR")
            cluster.wait_for_nodes()
        except Exception as exc:  # Ray raises many unrelated types when a node cannot start
            self._error = f"could not start a {self.num_nodes}-node Ray cluster: {exc}"
            try:
                ray.shutdown()
            finally:
                if "cluster" in locals():
                    cluster.shutdown()
            raise SystemUnavailable(self._error) from exc
        self._cluster = cluster

    def actor(self, cls: type, node: int, *args: Any, **options: Any) -> Any:
        """An actor of ``cls`` pinned to simulated node ``node``."""
        ray = _ray()
        self.ensure_started()
        resources = {f"{NODE_RESOURCE}{node}": 0.01}
        return ray.remote(cls).options(num_cpus=0, resources=resources, **options).remote(*args)

    @staticmethod
    def call(ref: Any) -> Any:
        ray = _ray()
        try:
            return ray.get(ref, timeout=_CALL_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError as exc:
            raise SystemUnavailable(f"a benchmark actor did not answer within {_CALL_TIMEOUT_S:.0f} s") from exc

    def node_resource(self, node: int) -> str:
        return f"{NODE_RESOURCE}{node}"

    def node_id(self, node: int) -> str:
        """Ray's id of simulated node ``node``."""
        ray = _ray()
        self.ensure_started()
        for info in ray.nodes():
            if info.get("Alive") and info.get("Resources", {}).get(self.node_resource(node), 0) > 0:
                return str(info["NodeID"])
        raise SystemUnavailable(f"simulated node {node} is not alive")

    def close(self) -> None:
        if self._cluster is None:
            return
        ray = _ray()
        try:
            ray.shutdown()
        finally:
            self._cluster.shutdown()
            self._cluster = None


def _kill(actors: list[Any]) -> None:
    ray = _ray()
    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:  # an actor that already died is what we wanted
            pass


# --- Ray object store ------------------------------------------------------------------------


class _RayStoreWriter:
    """Node 0: ``ray.put`` every payload; returns the refs wrapped in a list so Ray does not resolve them."""

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._items: list[Any] = []

    def prepare(self, workload: Workload) -> None:
        self._items = make_items(workload, self._seed)

    def put(self) -> tuple[float, list[Any]]:
        import ray

        with Stopwatch() as sw:
            # A write of several fields is one object (a tuple), as a trajectory travels through Ray.
            refs = [ray.put(item[0] if len(item) == 1 else item) for item in self._items]
        return sw.seconds, refs

    def finish(self) -> None:
        self._items = []


class _RayStoreReader:
    """Node 1: ``ray.get`` of every ref in one call, as a trainer reads its shard."""

    def get(self, refs: list[Any]) -> float:
        import ray

        with Stopwatch() as sw:
            arrays = ray.get(refs)
        del arrays
        return sw.seconds


class _WriterReaderSystem(BenchSystem):
    """A baseline run by a writer actor on node 0 and a reader actor on node 1."""

    across_processes = True

    def __init__(self, cluster: BenchCluster, seed: int = 0) -> None:
        self._cluster = cluster
        self._seed = seed
        self._writer: Any = None
        self._reader: Any = None

    def prepare(self, workload: Workload) -> None:
        self._cluster.call(self._writer.prepare.remote(workload))

    def finish(self, workload: Workload) -> None:
        self._cluster.call(self._writer.finish.remote())

    def _kill_actors(self) -> None:
        _kill([a for a in (self._writer, self._reader) if a is not None])
        self._writer = self._reader = None


class RayObjectStoreSystem(_WriterReaderSystem):
    name = "ray-object-store"

    def start(self) -> None:
        self._writer = self._cluster.actor(_RayStoreWriter, 0, self._seed)
        self._reader = self._cluster.actor(_RayStoreReader, 1)

    def run_round(self, workload: Workload) -> RoundTiming:
        put_s, refs = self._cluster.call(self._writer.put.remote())
        get_s = self._cluster.call(self._reader.get.remote(refs))
        # The driver's refs are the last ones: dropping them frees the objects before the next round.
        del refs
        return RoundTiming(put_s, get_s)

    def close(self) -> None:
        self._kill_actors()

    def describe(self) -> dict[str, object]:
        return {"path": "ray.put in an actor on node 0, ray.get in an actor on node 1 (simulated nodes)"}


# --- transferqueue (PyPI) --------------------------------------------------------------------

_TQ_PARTITION = "dressage-bench"


# transferqueue sets each logger's level from TQ_LOGGING_LEVEL; on a 2-core host it warns about its
# thread count on every put. Errors only: the baseline should not pay for log lines in timed rounds.
# Actors it creates (controller, storage units) inherit the writer's runtime_env.
_TQ_RUNTIME_ENV = {"env_vars": {"TQ_LOGGING_LEVEL": "ERROR"}}


def _quiet_tq() -> None:
    import os
    import warnings

    os.environ.setdefault("TQ_LOGGING_LEVEL", "ERROR")
    warnings.filterwarnings("ignore", message=r".*nested tensors.*", category=UserWarning)


class _TQWriter:
    """Node 0: initialises transferqueue (controller + SimpleStorage units) and ``kv_put``s payloads."""

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._fields: list[dict[str, Any]] = []
        self._round = 0

    def init(self, conf: dict[str, Any]) -> None:
        _quiet_tq()
        import transfer_queue as tq
        from omegaconf import OmegaConf

        tq.init(OmegaConf.create(conf))

    def prepare(self, workload: Workload) -> None:
        import torch

        names = [p.field for p in workload.parts]
        self._fields = [{n: torch.from_numpy(a) for n, a in zip(names, item)}
                        for item in make_items(workload, self._seed)]

    def put(self, prefix: str) -> tuple[float, list[str]]:
        import transfer_queue as tq

        self._round += 1
        keys = [f"{prefix}/{self._round}/{i}" for i in range(len(self._fields))]
        # One kv_put per write (all fields of a step in it): the Proxy writes each step as it
        # arrives, not in a batch.
        with Stopwatch() as sw:
            for key, fields in zip(keys, self._fields):
                tq.kv_put(key=key, partition_id=_TQ_PARTITION, fields=fields)
        return sw.seconds, keys

    def clear(self, keys: list[str]) -> None:
        import transfer_queue as tq

        tq.kv_clear(keys=keys, partition_id=_TQ_PARTITION)

    def finish(self) -> None:
        self._fields = []

    def close(self) -> None:
        import transfer_queue as tq

        tq.close()


class _TQReader:
    """Node 1: joins the running transferqueue and reads every key of a round in one ``kv_batch_get``."""

    def init(self) -> None:
        _quiet_tq()
        import transfer_queue as tq

        tq.init()

    def get(self, keys: list[str]) -> tuple[float, str]:
        import transfer_queue as tq

        with Stopwatch() as sw:
            data = tq.kv_batch_get(keys=keys, partition_id=_TQ_PARTITION)
        value = data[next(iter(data.keys()))]
        kind = f"{type(value).__name__}{'(nested)' if getattr(value, 'is_nested', False) else ''}"
        del data, value
        return sw.seconds, kind

    def close(self) -> None:
        import transfer_queue as tq

        tq.close()


class TransferQueueSystem(_WriterReaderSystem):
    """``transferqueue`` 0.1.11 with one SimpleStorage unit pinned to node 1, beside the reader."""

    name = "transferqueue"

    def __init__(self, cluster: BenchCluster, seed: int = 0) -> None:
        super().__init__(cluster, seed)
        self._returned: str | None = None
        self._version: str | None = None

    def start(self) -> None:
        missing = [m for m in ("transfer_queue", "torch", "tensordict") if importlib.util.find_spec(m) is None]
        if missing:
            raise SystemUnavailable(
                f"{', '.join(missing)} not installed; pip install -e 'benchmarks[baselines]' (transferqueue==0.1.11, CPU torch)"
            )
        from importlib.metadata import version

        self._version = version("transferqueue")
        self._cluster.ensure_started()
        conf = {
            "backend": {
                "storage_backend": "SimpleStorage",
                "SimpleStorage": {
                    "num_data_storage_units": 1,
                    # The unit lives on the reader's node: the writer's put crosses nodes,
                    # the reader's get is local to the unit, as a trainer reads its shard.
                    "required_node_resource": self._cluster.node_resource(1),
                },
            }
        }
        self._writer = self._cluster.actor(_TQWriter, 0, self._seed, runtime_env=_TQ_RUNTIME_ENV)
        self._reader = self._cluster.actor(_TQReader, 1, runtime_env=_TQ_RUNTIME_ENV)
        try:
            self._cluster.call(self._writer.init.remote(conf))
            self._cluster.call(self._reader.init.remote())
        except SystemUnavailable:
            raise
        except Exception as exc:  # transferqueue / Ray errors at init: the baseline cannot run here
            raise SystemUnavailable(f"transferqueue {self._version} did not start: {exc}") from exc

    def run_round(self, workload: Workload) -> RoundTiming:
        put_s, keys = self._cluster.call(self._writer.put.remote(workload.name))
        get_s, self._returned = self._cluster.call(self._reader.get.remote(keys))
        self._cluster.call(self._writer.clear.remote(keys))
        return RoundTiming(put_s, get_s)

    def close(self) -> None:
        ray = _ray()
        for actor in (self._reader, self._writer):  # reader first: the writer owns the storage
            if actor is None:
                continue
            try:
                ray.get(actor.close.remote(), timeout=60)
            except Exception:  # already dead or stuck: the kill below cleans up
                pass
        self._kill_actors()

    def describe(self) -> dict[str, object]:
        return {
            "version": self._version,
            "path": "kv_put in an actor on node 0 -> SimpleStorageUnit on node 1 -> kv_batch_get in an actor on node 1",
            "get_returns": self._returned,
        }
