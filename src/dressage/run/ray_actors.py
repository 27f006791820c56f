"""``dressage run --ray``: RolloutManager and DP trainer readers as Ray actors.

Finalized Segments reach the RolloutManager actor through Ray; it ``ray.put``s one shard per
DP rank, as slime does. With TQ on, those objects carry only resident token fields and refs;
each trainer reads its shard's large fields from the StorageUnits over ZMQ.
"""

from __future__ import annotations

from typing import Any

import ray

from dressage.rollout import RolloutManager
from dressage.rollout.manager import sample_ref_keys, sample_resident_nbytes
from dressage.train import TrainingReader, release_batch

__all__ = ["start_ray_backend", "RayBackend"]


@ray.remote(num_cpus=0)
class RolloutManagerActor:
    def __init__(self, dp_size: int) -> None:
        self.rm = RolloutManager(dp_size=dp_size)

    def add(self, done: Any) -> int:
        return len(self.rm.add_finalized(done))

    def held(self) -> int:
        return self.rm.held_nbytes()

    def take_batch_refs(self, rollout_id: int) -> tuple[list[Any], list[str], int]:
        batch = self.rm.take_batch(rollout_id)
        keys = sorted(sample_ref_keys(batch.samples))
        nbytes = sum(sample_resident_nbytes(s) for s in batch.samples)
        return [ray.put(shard) for shard in batch.shards], keys, nbytes


@ray.remote(num_cpus=0)
class TrainerActor:
    """One DP rank: restores its shard from TQ and runs the consumer's checks."""

    def __init__(self, tq_spec: dict | None, model: Any) -> None:
        self.client = None
        if tq_spec is not None:
            from dressage.tq import TransferQueueClient

            self.client = TransferQueueClient.connect(tq_spec)
        self.model = model

    def consume(self, shard: list) -> tuple[dict, int]:
        from dressage.run.loop import _summarise_shard

        before = self.client.counters.bytes_read if self.client else 0
        TrainingReader(self.client).restore(shard)
        after = self.client.counters.bytes_read if self.client else 0
        return _summarise_shard(shard, self.model), after - before


class RayBackend:
    def __init__(self, cfg: Any, tq_spec: dict | None, client: Any) -> None:
        if not ray.is_initialized():
            # Without --ray-address, a fresh local cluster (never whatever else runs on this host).
            ray.init(address=cfg.ray_address or "local", include_dashboard=False, log_to_driver=False,
                     **({} if cfg.ray_address else {"num_cpus": 2}))
            self._owns_ray = True
        else:
            self._owns_ray = False
        self.client = client
        self.rm = RolloutManagerActor.remote(cfg.dp_size)
        self.trainers = [TrainerActor.remote(tq_spec, cfg.data_plane.model) for _ in range(cfg.dp_size)]

    def sink(self, done: Any) -> None:
        ray.get(self.rm.add.remote(done))

    def held_nbytes(self) -> int:
        return int(ray.get(self.rm.held.remote()))

    def train(self, rollout_id: int) -> tuple[list[dict], int, int]:
        refs, keys, rm_bytes = ray.get(self.rm.take_batch_refs.remote(rollout_id))
        results = ray.get([t.consume.remote(ref) for t, ref in zip(self.trainers, refs)])
        if self.client is not None:
            release_batch(self.client, keys)  # once every rank has trained on the batch
        return [r[0] for r in results], rm_bytes, sum(r[1] for r in results)

    def close(self) -> None:
        for a in [self.rm, *self.trainers]:
            ray.kill(a)
        if self._owns_ray:
            ray.shutdown()


def start_ray_backend(cfg: Any, tq_spec: dict | None, client: Any = None) -> RayBackend:
    return RayBackend(cfg, tq_spec, client)
