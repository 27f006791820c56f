"""Dressage's own TransferQueue under the bench: embedded (one process) and across processes.

The systems use only the public client API (``TransferQueue.start``, ``client.put`` / ``get_many`` /
``clear``), so the figures are what a Proxy and a trainer would get.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dressage_bench._systems import BenchSystem, SystemUnavailable, Workload, make_items
from dressage_bench._timing import RoundTiming, Stopwatch

__all__ = ["DressageEmbeddedSystem", "tq_budget_bytes"]

MiB = 1 << 20


def tq_budget_bytes(largest_round_bytes: int) -> int:
    """The deployment's default StorageUnit budget, raised if needed to hold two rounds.

    The default, not a tight fit: a unit sizes internal structures (its buffer pool) from its budget,
    and a bench must measure what a default deployment does. Never less than two rounds, so a bench
    never measures spilling to disk.
    """
    try:
        from dressage.tq import TransferQueueConfig

        default = int(TransferQueueConfig().budget_bytes)
    except ImportError:
        default = 4 << 30
    return max(default, 2 * int(largest_round_bytes) + 64 * MiB)


def _put_all(client: Any, workload: Workload, items: list[tuple[Any, ...]], batch: str) -> list[Any]:
    """One ``put`` per write; a write of several fields (one step's R3 + logprobs) is one ``put_many``,
    as the Proxy's commit region writes a step."""
    if len(workload.parts) == 1:
        field = workload.parts[0].field
        return [client.put(field, item[0], batch=batch) for item in items]
    fields = [p.field for p in workload.parts]
    refs: list[Any] = []
    for item in items:
        refs.extend(client.put_many(list(zip(fields, item)), batch=batch))
    return refs


def _import_tq() -> Any:
    try:
        import dressage.tq as dtq
    except ImportError as exc:
        raise SystemUnavailable(f"dressage.tq is not importable: {exc}") from exc
    for name in ("TransferQueue", "TransferQueueConfig"):
        if not hasattr(dtq, name):
            raise SystemUnavailable(f"dressage.tq has no {name} yet")
    return dtq


class DressageEmbeddedSystem(BenchSystem):
    """Client and StorageUnit in this process: the ``embedded`` deployment ``dressage run`` uses."""

    name = "dressage-embedded"

    def __init__(self, budget_bytes: int, seed: int = 0, *, options: Mapping[str, Any] | None = None) -> None:
        self._budget = int(budget_bytes)
        self._seed = seed
        self._options = dict(options or {})
        self._tq: Any = None
        self._client: Any = None
        self._items: list[Any] = []
        self._round = 0

    def start(self) -> None:
        dtq = _import_tq()
        config = dtq.TransferQueueConfig(**{
            "unit_memory_budget": self._budget, "on_full": "error", "retention_s": None,
            **self._options, "deployment": "embedded",
        })
        self._tq = dtq.TransferQueue.start(config)
        self._client = self._tq.client()

    def prepare(self, workload: Workload) -> None:
        self._items = make_items(workload, self._seed)

    def run_round(self, workload: Workload) -> RoundTiming:
        self._round += 1
        batch = f"bench-{workload.name}-{self._round}"
        client = self._client
        with Stopwatch() as put:
            refs = _put_all(client, workload, self._items, batch)
        with Stopwatch() as get:
            arrays = client.get_many(refs)
        del arrays
        client.clear(batch)
        return RoundTiming(put.seconds, get.seconds)

    def finish(self, workload: Workload) -> None:
        self._items = []

    def close(self) -> None:
        if self._tq is not None:
            self._tq.shutdown()
            self._tq = self._client = None

    def describe(self) -> dict[str, object]:
        return {"path": "client.put -> in-process StorageUnit -> client.get_many, one process",
                "get_returns": "read-only views of the unit's memory (no copy)"}



# --- across processes ------------------------------------------------------------------------


class _DressageWriter:
    """Node 0: a client joined from the deployment's spec; ``put``s each payload of a round."""

    def __init__(self, spec: dict[str, Any], seed: int, node_id: str | None, other_host: bool = False) -> None:
        from dressage.tq import TransferQueueClient

        if other_host:
            # Simulated nodes share this machine's /dev/shm. A writer on a second host could not map
            # the unit's segments: this process reports another host identity, so its client writes
            # over the socket path, as that host's would, while the reader beside the unit maps them.
            from dressage.tq.transport import shm

            shm.host_id = lambda: "bench-writer-host"  # type: ignore[assignment]
        # node_id is where writes should land (the client prefers StorageUnits on that node).
        self._client = TransferQueueClient.connect(spec, node_id=node_id)
        self._seed = seed
        self._items: list[Any] = []

    def ready(self) -> bool:
        return True

    def prepare(self, workload: Workload) -> None:
        self._items = make_items(workload, self._seed)

    def put(self, workload: Workload, batch: str) -> tuple[float, list[Any]]:
        client = self._client
        with Stopwatch() as sw:
            refs = _put_all(client, workload, self._items, batch)
        # Refs go to the reader in their msgpack-able wire form, as they travel inside Samples.
        return sw.seconds, [r.to_wire() for r in refs]

    def clear(self, batch: str) -> int:
        return self._client.clear(batch)

    def finish(self) -> None:
        self._items = []

    def close(self) -> None:
        self._client.close()


class _DressageReader:
    """Node 1: a client joined from the same spec; one ``get_many`` per round, as the trainer reads."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from dressage.tq import TransferQueueClient

        self._client = TransferQueueClient.connect(spec)

    def ready(self) -> bool:
        return True

    def get(self, wire_refs: list[Any]) -> float:
        from dressage.tq import FieldRef

        refs = [FieldRef.from_wire(w) for w in wire_refs]
        with Stopwatch() as sw:
            arrays = self._client.get_many(refs)
        del arrays
        return sw.seconds

    def close(self) -> None:
        self._client.close()


class DressageAcrossSystem(BenchSystem):
    """Writer, StorageUnit and reader in separate processes on two simulated nodes, data over ZMQ.

    The ``ray`` deployment (Controller and one StorageUnit actor per node). The writer is an actor on
    node 0 whose client prefers the unit on node 1, and the reader an actor on node 1, so the put
    crosses nodes and the get is served by the unit beside the reader (a Proxy writing to its own
    node's unit would move the crossing to the get instead; on one host both cost the same).

    ``dressage-zmq`` turns shared memory off, so both the put and the get cross TCP: a reader that is
    on neither the writer's nor the unit's host. ``dressage-2host`` is two real hosts with the
    defaults: the writer's process takes another host identity, so its put crosses TCP, and the
    reader beside the unit maps the unit's segments, as on the unit's own host.
    """

    across_processes = True

    def __init__(self, cluster: Any, budget_bytes: int, seed: int = 0, *, shm: bool = False,
                 writer_elsewhere: bool = False, options: Mapping[str, Any] | None = None) -> None:
        if writer_elsewhere and not shm:
            raise ValueError("writer_elsewhere is the shared-memory deployment with the writer on another host")
        self.name = ("dressage-2host" if writer_elsewhere else  # type: ignore[misc]
                     "dressage-shm" if shm else "dressage-zmq")
        self._writer_elsewhere = writer_elsewhere
        self._options = dict(options or {})
        self._cluster = cluster
        self._budget = int(budget_bytes)
        self._seed = seed
        self._shm = shm
        self._tq: Any = None
        self._writer: Any = None
        self._reader: Any = None
        self._round = 0
        self._units: dict[str, Any] = {}
        self._target_node: str | None = None
        self._written_to: set[str] = set()

    def start(self) -> None:
        dtq = _import_tq()
        if not hasattr(dtq.TransferQueue, "client_spec"):
            raise SystemUnavailable("dressage.tq has no cross-process client (client_spec) yet")
        options: dict[str, Any] = {}
        if "shared_memory" in {f.name for f in dataclasses.fields(dtq.TransferQueueConfig)}:
            # Simulated nodes share one host, where the default moves large payloads through /dev/shm:
            # dressage-zmq turns that off to measure the socket path a real second host would use.
            options["shared_memory"] = self._shm
        elif self._shm:
            raise SystemUnavailable("dressage.tq offers no shared-memory path between processes")
        self._cluster.ensure_started()
        config = dtq.TransferQueueConfig(**{
            "unit_memory_budget": self._budget, "on_full": "error", "retention_s": None,
            **self._options, **options, "deployment": "ray",
        })
        try:
            self._tq = dtq.TransferQueue.start(config)
            spec = self._tq.client_spec()
        except ImportError as exc:
            raise SystemUnavailable(f"dressage.tq ray deployment is not available: {exc}") from exc
        self._units = {u["unit_id"]: u.get("node_id") for u in spec["units"]}
        self._target_node = self._cluster.node_id(1)
        if self._target_node not in self._units.values():
            raise SystemUnavailable(f"no StorageUnit on the reader's node: units {self._units}")
        self._writer = self._cluster.actor(_DressageWriter, 0, spec, self._seed, self._target_node,
                                           self._writer_elsewhere)
        self._reader = self._cluster.actor(_DressageReader, 1, spec)
        # Constructors run lazily in the actor: surface a failed connect here, not in round one.
        self._cluster.call(self._writer.ready.remote())
        self._cluster.call(self._reader.ready.remote())

    def prepare(self, workload: Workload) -> None:
        self._cluster.call(self._writer.prepare.remote(workload))

    def run_round(self, workload: Workload) -> RoundTiming:
        self._round += 1
        batch = f"bench-{workload.name}-{self._round}"
        put_s, refs = self._cluster.call(self._writer.put.remote(workload, batch))
        self._written_to.update(w[2] for w in refs)  # wire form: [tag, key, unit_id, ...]
        get_s = self._cluster.call(self._reader.get.remote(refs))
        self._cluster.call(self._writer.clear.remote(batch))
        return RoundTiming(put_s, get_s)

    def finish(self, workload: Workload) -> None:
        self._cluster.call(self._writer.finish.remote())

    def close(self) -> None:
        import ray

        for actor in (self._writer, self._reader):
            if actor is None:
                continue
            try:
                ray.get(actor.close.remote(), timeout=30)
            except Exception:  # already gone: the kill below is all that is left to do
                pass
            try:
                ray.kill(actor)
            except Exception:
                pass
        self._writer = self._reader = None
        if self._tq is not None:
            self._tq.shutdown()
            self._tq = None

    def describe(self) -> dict[str, object]:
        nodes = {uid: ("node1" if n == self._target_node else "node0") for uid, n in self._units.items()}
        tcp = "TCP: ZMQ for control and small puts, the unit's bulk stream for payloads"
        shm = "/dev/shm segments (payloads >= 256 KiB; smaller ones over ZMQ)"
        via = (f"put over {tcp} (the writer's process reports another host), get over {shm}"
               if self._writer_elsewhere else shm if self._shm else tcp)
        return {
            "path": f"client.put in an actor on node 0 -> StorageUnit actor on node 1 (ray deployment, {via}) "
                    "-> client.get_many in an actor on node 1",
            "units": nodes,
            "get_returns": "read-only maps of the unit's segments (no copy)" if self._shm
            else "read-only views of the received bytes (pooled receive buffers)",
            "written_to": sorted(self._written_to),
        }
