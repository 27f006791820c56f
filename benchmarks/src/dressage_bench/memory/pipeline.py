"""One measured run of the synchronous GRPO-style loop, TQ off or on, on a fresh two-node Ray cluster.

Node 0 (master) hosts the Proxy, the RolloutManager, its object store, the TQ Controller and one
StorageUnit; node 1 hosts the engine, the trainer readers and the other StorageUnit. A sampler thread
records every component's memory for the whole run; phase marks and logical sizes are taken in between.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dressage.harness.agents import AgentConfig, make_prompts, run_rollout
from dressage_bench._ray import BenchCluster
from dressage_bench.memory.actors import EngineActor, ProxyActor
from dressage_bench.memory.proxy_process import ProxyProcess
from dressage_bench.memory.floor import floor_actor, floor_pid
from dressage_bench.memory.config import MemoryBenchConfig
from dressage_bench.memory.sampler import ComponentSpec, MemorySampler, Timeline, plasma_file, raylet_pid
from dressage.errors import DressageError
from dressage.train.digest import combine_digests
from dressage.train.ray_actors import RolloutManagerActor

__all__ = ["PathRun", "run_path", "METRIC_COMPONENTS"]

# M_master's components, per path, in the seed's order.
METRIC_COMPONENTS = {
    "without_tq": ("proxy", "rollout_manager", "object_store"),
    "with_tq": ("proxy", "rollout_manager", "object_store", "tq_controller", "tq_storage_unit_master"),
}
_CALL_TIMEOUT_S = 600.0
_IDLE_S = 1.0   # idle window after the warm-up round: each component's footprint before any batch
_TAIL_S = 1.5   # sampling after the last release, so the final drop shows


@dataclass(slots=True)
class PathRun:
    """What one run measured: the timeline, each component's peak and idle level, logical sizes, counts."""

    path: str
    dtype: str
    timeline: Timeline
    measure_start: float = 0.0
    idle: dict[str, int] = field(default_factory=dict)
    logical: dict[str, int] = field(default_factory=dict)
    """Peak logical bytes seen at phase boundaries (arrays held, object store used, unit payload bytes)."""
    counts: dict[str, int] = field(default_factory=dict)
    rollouts: list[dict[str, Any]] = field(default_factory=list)
    digest: str = ""
    wall_s: float = 0.0

    @property
    def components(self) -> tuple[str, ...]:
        return METRIC_COMPONENTS[self.path]

    def peaks(self) -> dict[str, int]:
        return {n: self.timeline.peak(n, self.measure_start) for n in self.timeline.names}

    def master_peak(self) -> tuple[int, float]:
        return self.timeline.master_peak(self.measure_start)


def _get(ref: Any) -> Any:
    import ray

    return ray.get(ref, timeout=_CALL_TIMEOUT_S)


def _agent_config(cfg: MemoryBenchConfig, *, max_turns: int | None = None) -> AgentConfig:
    return AgentConfig(max_turns=max_turns or cfg.max_turns, tools=cfg.tool_call_rate > 0,
                       retry_rate=cfg.retry_rate, context_length=cfg.context_length, max_tokens=cfg.max_tokens,
                       seed=cfg.seed)


def _node_store(cluster: BenchCluster, node: int) -> str | None:
    """The plasma file of simulated node ``node`` (via its raylet's open fd)."""
    import ray

    for info in ray.nodes():
        if info.get("Alive") and info.get("Resources", {}).get(cluster.node_resource(node), 0) > 0:
            pid = raylet_pid(info["ObjectStoreSocketName"])
            return plasma_file(pid) if pid is not None else None
    return None


def _store_used(cluster: BenchCluster, node: int) -> int:
    """Live object bytes in node ``node``'s object store (Ray's own accounting)."""
    import ray
    from ray._private.internal_api import node_stats

    for info in ray.nodes():
        if info.get("Alive") and info.get("Resources", {}).get(cluster.node_resource(node), 0) > 0:
            reply = node_stats(info["NodeManagerAddress"], info["NodeManagerPort"], include_memory_info=False)
            return int(reply.store_stats.object_store_bytes_used)
    return 0


class _Plane:
    """The components of one run and the calls of one loop iteration."""

    def __init__(self, cfg: MemoryBenchConfig, dtype: str, with_tq: bool, cluster: BenchCluster) -> None:
        import ray

        from dressage.engine.config import EngineConfig
        from dressage.dataplane import DataPlaneConfig
        from dressage.train.ray_actors import TrainerActor

        self.cfg, self.cluster, self.with_tq = cfg, cluster, with_tq
        self.actors: list[Any] = []
        self.tq: Any = None
        self.tq_client: Any = None
        engine_cfg = EngineConfig(model=cfg.model, port=0, seed=cfg.seed, mean_response_tokens=cfg.mean_response_tokens,
                                  tool_call_rate=cfg.tool_call_rate, context_length=cfg.context_length)
        self.engine = self._actor(EngineActor, 1, engine_cfg)
        engine_url = _get(self.engine.url.remote())
        spec = None
        if with_tq:
            from dressage.tq import TransferQueue, TransferQueueConfig

            self.tq = TransferQueue.start(TransferQueueConfig(
                deployment="ray", unit_memory_budget=cfg.unit_memory_budget, retention_s=None))
            spec = self.tq.client_spec()
            self.tq_client = self.tq.client()
        self.rm = self._actor(RolloutManagerActor, 0, cfg.dp_size)
        self.floor = floor_actor(resources={cluster.node_resource(0): 0.01})
        self.actors.append(self.floor)
        dp = DataPlaneConfig(model=cfg.model, use_rollout_routing_replay=True, enable_transfer_queue=with_tq,
                             routed_experts_dtype=dtype)
        spread = cfg.placement == "spread"
        if cfg.proxy_deployment == "ray":
            self.proxy: Any = self._actor(ProxyActor, 0, dp, engine_url, self.rm, spec, spread)
        else:
            self.proxy = ProxyProcess({"model": dataclasses.asdict(cfg.model), "dtype": dtype, "engine_url": engine_url,
                                       "tq_spec": spec, "spread": spread, "node_id": cluster.node_id(0)})
        self.proxy_url = self.proxy_call("url")
        res = {cluster.node_resource(1): 0.01}
        self.trainers = [ray.remote(TrainerActor).options(num_cpus=0, resources=res).remote(spec, cfg.model) for _ in range(cfg.dp_size)]
        self.actors += self.trainers
        ray.get([t.__ray_ready__.remote() for t in self.trainers], timeout=_CALL_TIMEOUT_S)

    def proxy_call(self, name: str, *args: Any) -> Any:
        """Call the Proxy host's method ``name``: a Ray actor call, or a request to the Proxy process."""
        if isinstance(self.proxy, ProxyProcess):
            return getattr(self.proxy, name)(*args)
        return _get(getattr(self.proxy, name).remote(*args))

    def deliver(self) -> None:
        """Hand the rollout's finalized sessions to the RolloutManager. A Ray actor Proxy pushed each one
        as it finalized; from a Proxy process the RolloutManager drains them over ``/trajectory/read``."""
        if isinstance(self.proxy, ProxyProcess):
            _get(self.rm.read_proxy.remote(self.proxy_url, max_groups=self.cfg.read_groups))

    def _actor(self, cls: type, node: int, *args: Any) -> Any:
        actor = self.cluster.actor(cls, node, *args)
        self.actors.append(actor)
        return actor

    def components(self) -> list[ComponentSpec]:
        proxy_pid, rm_pid = self.proxy_call("pid"), _get(self.rm.pid.remote())
        specs = [ComponentSpec("proxy", (proxy_pid,)), ComponentSpec("rollout_manager", (rm_pid,)),
                 ComponentSpec("object_store", file=_node_store(self.cluster, 0)),
                 ComponentSpec("ray_actor_floor", (floor_pid(self.floor, _CALL_TIMEOUT_S),), in_metric=False)]
        if self.tq is not None:
            pids, nodes = self.tq.processes(), self._unit_nodes()
            master = self.cluster.node_id(0)
            local = [u for u, n in nodes.items() if n == master]
            remote = [u for u, n in nodes.items() if n != master]
            specs += [ComponentSpec("tq_controller", (pids["controller"],)),
                      ComponentSpec("tq_storage_unit_master", tuple(pids[u] for u in local)),
                      ComponentSpec("tq_storage_unit_node1", tuple(pids[u] for u in remote), in_metric=False)]
        specs.append(ComponentSpec("object_store_node1", file=_node_store(self.cluster, 1), in_metric=False))
        return specs

    def _unit_nodes(self) -> dict[str, str | None]:
        return {u.unit_id: u.node_id for u in self.tq.units()}

    def unit_bytes(self) -> dict[str, int]:
        """Payload bytes per StorageUnit, keyed by master / node1."""
        if self.tq is None:
            return {}
        master = self.cluster.node_id(0)
        nodes = self._unit_nodes()
        out = {"tq_storage_unit_master": 0, "tq_storage_unit_node1": 0}
        for uid, row in self.tq.stats().items():
            key = "tq_storage_unit_master" if nodes.get(uid) == master else "tq_storage_unit_node1"
            out[key] += int(row.get("bytes", 0))
        return out

    def state_sizes(self) -> dict[str, Any]:
        """What each stateful component still holds (after a release: what it keeps across batches)."""
        out: dict[str, Any] = {"proxy": self.proxy_call("state_sizes")}
        if self.tq is not None:
            keep = ("keys", "bytes", "held_bytes", "pooled_bytes", "shm_segments", "shm_bytes", "directory_keys",
                    "directory_bytes", "pending", "queued_deletes")
            out["tq_units"] = {uid: {k: row[k] for k in keep if k in row} for uid, row in self.tq.stats().items()}
        return out

    def rollout(self, rollout_id: int, n_prompts: int, n_samples: int, agent_cfg: AgentConfig) -> Any:
        self.proxy_call("set_rollout", rollout_id)
        prompts = make_prompts(n_prompts, seed=self.cfg.seed * 1000 + rollout_id)
        return asyncio.run(run_rollout(self.proxy_url, prompts, n_samples, agent_cfg,
                                       concurrency=self.cfg.concurrency))

    def take_batch(self, rollout_id: int) -> tuple[list[Any], list[str], int, int]:
        return _get(self.rm.take_batch_refs.remote(rollout_id))

    def train(self, refs: list[Any]) -> list[dict[str, Any]]:
        results = _get([t.consume.remote(ref) for t, ref in zip(self.trainers, refs)])
        return [r[0] for r in results]

    def release(self, keys: list[str]) -> None:
        from dressage.train import release_batch

        if self.tq_client is not None:
            release_batch(self.tq_client, keys)  # once every rank has trained on the batch
        self.proxy_call("forget_finished")

    def close(self) -> None:
        import ray

        hosted = [self.engine]
        if isinstance(self.proxy, ProxyProcess):
            self.proxy.stop()
        else:
            hosted.append(self.proxy)
        for actor in hosted:
            try:
                ray.get(actor.stop.remote(), timeout=10)
            except Exception:  # already gone: the kill below is all that is left to do
                pass
        if self.tq is not None:
            self.tq.shutdown()
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # an actor that already died is what we wanted
                pass


def _bump(store: dict[str, int], values: dict[str, int]) -> None:
    for k, v in values.items():
        store[k] = max(store.get(k, 0), int(v))


def run_path(cfg: MemoryBenchConfig, dtype: str, with_tq: bool,
             on_rollout: Callable[[str], None] | None = None) -> PathRun:
    """Start a fresh cluster, run ``cfg.num_rollouts`` iterations on one path, measure, shut everything down."""
    path = "with_tq" if with_tq else "without_tq"
    t0 = time.perf_counter()
    # A fresh cluster per run: deleted objects do not shrink a store's pages until it shuts down.
    cluster = BenchCluster(cfg.object_store_bytes)
    cluster.ensure_started()
    plane: _Plane | None = None
    try:
        plane = _Plane(cfg, dtype, with_tq, cluster)
        sampler = MemorySampler(plane.components(), interval_s=cfg.interval_s)
        run = PathRun(path=path, dtype=dtype, timeline=sampler.timeline)
        with sampler:
            _warm_up(plane, cfg, sampler)
            time.sleep(_IDLE_S)
            run.measure_start = sampler.now()
            run.idle = {n: run.timeline.mean_between(n, run.measure_start - _IDLE_S, run.measure_start)
                        for n in run.timeline.names}
            sampler.mark("measure")
            digests = []
            for i in range(cfg.num_rollouts):
                digests.append(_iteration(plane, cfg, i, run, sampler))
                if on_rollout is not None:
                    on_rollout(f"{path} {dtype} rollout {i}")
            time.sleep(_TAIL_S)
        run.digest = combine_digests((i, bytes.fromhex(d)) for i, d in enumerate(digests))
    finally:
        if plane is not None:
            plane.close()
        cluster.close()
    run.wall_s = time.perf_counter() - t0
    return run


def _warm_up(plane: _Plane, cfg: MemoryBenchConfig, sampler: MemorySampler) -> None:
    """One tiny session through every stage, so code paths and connections exist before the idle window."""
    sampler.mark("warm-up")
    rid = 10_000  # apart from the measured rollouts' ids
    plane.rollout(rid, 1, 1, _agent_config(cfg, max_turns=2))
    plane.deliver()
    refs, keys, _, _ = plane.take_batch(rid)
    plane.train(refs)
    del refs
    plane.release(keys)


def _iteration(plane: _Plane, cfg: MemoryBenchConfig, i: int, run: PathRun, sampler: MemorySampler) -> str:
    sampler.mark(f"rollout {i}")
    t_start = time.perf_counter()
    rr = plane.rollout(i, cfg.rollout_batch_size, cfg.n_samples_per_prompt, _agent_config(cfg))
    if rr.finalized == 0:
        raise DressageError(f"{run.path}/{run.dtype} rollout {i}: no agent session finalized "
                            f"({rr.errors_by_kind or 'no errors reported'})")
    held = plane.proxy_call("held")
    t_rolled = time.perf_counter()
    sampler.mark(f"deliver {i}")
    plane.deliver()
    t_delivered = time.perf_counter()
    rm_held = _get(plane.rm.held.remote())
    _bump(run.logical, {"proxy_large_fields": held["large_fields"], "proxy_token_fields": held["token_fields"],
                        "rollout_manager_large_fields": rm_held["large_fields"],
                        "rollout_manager_token_fields": rm_held["token_fields"], **plane.unit_bytes()})
    sampler.mark(f"batch {i}")
    refs, keys, rm_bytes, n_samples = plane.take_batch(i)
    t_taken = time.perf_counter()
    _bump(run.logical, {"object_store": _store_used(plane.cluster, 0)})
    sampler.mark(f"train {i}")
    parts = plane.train(refs)
    _bump(run.logical, {"object_store_node1": _store_used(plane.cluster, 1)})
    del refs  # the driver holds the last references: the shards leave the store here
    t_trained = time.perf_counter()
    sampler.mark(f"release {i}")
    plane.release(keys)
    t_released = time.perf_counter()
    keyed = [kd for p in parts for kd in p["digests"]]
    digest = combine_digests(keyed)
    summary = {"rollout": i, "sessions": rr.sessions, "finalized": rr.finalized, "agent_errors": rr.errors,
               "steps": held["steps"], "segments": sum(p["segments"] for p in parts),
               "tokens": sum(p["tokens"] for p in parts), "rollout_manager_bytes": rm_bytes,
               "tq_keys": len(keys), "digest": digest,
               "phase_s": {"rollout": round(t_rolled - t_start, 3), "deliver": round(t_delivered - t_rolled, 3),
                           "take_batch": round(t_taken - t_delivered, 3),
                           "train": round(t_trained - t_taken, 3), "release": round(t_released - t_trained, 3)},
               "load_avg": list(os.getloadavg()),
               "after_release": plane.state_sizes(),
               "restored_bytes": {n: sum(p["large_field_bytes"].get(n, 0) for p in parts)
                                  for n in ("logprobs", "routed_experts")}}
    if summary["segments"] != n_samples:
        raise DressageError(f"{run.path}/{run.dtype} rollout {i}: trainers got {summary['segments']} of "
                            f"{n_samples} Samples")
    run.rollouts.append(summary)
    for k in ("sessions", "finalized", "agent_errors", "steps", "segments", "tokens"):
        run.counts[k] = run.counts.get(k, 0) + int(summary[k])
    return digest
