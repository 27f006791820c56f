"""The Ray actors of rollout and training, used by ``dressage run --ray`` and the memory benchmark.

Finalized Segments reach the :class:`RolloutManagerActor` through Ray; it ``ray.put``s one shard
per DP rank, as slime does. With TQ on, those objects carry only resident token fields and refs;
each :class:`TrainerActor` reads its shard's large fields from the StorageUnits over ZMQ. The
classes are plain: callers wrap them with ``ray.remote`` and the options (resources) they need.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

import ray

from dressage.errors import ConfigError, DressageError
from dressage.fields import ModelSpec
from dressage.rollout import RolloutManager
from dressage.rollout.manager import sample_ref_keys, sample_resident_nbytes
from dressage.train.reader import TrainingReader, releasing
from dressage.train.remote import ProxyTrajectorySource, drain
from dressage.train.summary import summarise_shard

__all__ = ["RolloutManagerActor", "TrainerActor", "RayBackend", "RayBackendConfig", "start_ray_backend", "join_ray"]

_LARGE = ("rollout_log_probs", "rollout_routed_experts")
_READ_TIMEOUT_S = 300.0  # one trajectory read: without TQ it carries a group's large fields


class RolloutManagerActor:
    """The master's RolloutManager: Samples accumulate here until the batch is cut and put per shard."""

    def __init__(self, dp_size: int) -> None:
        self.rm = RolloutManager(dp_size=dp_size)
        self._held = {"large_fields": 0, "token_fields": 0}

    def pid(self) -> int:
        return os.getpid()

    def add(self, done: Any) -> int:
        """Queue one finalized session pushed by a Proxy in another Ray process (its sink)."""
        return self._count(self.rm.add_finalized(done))

    def read_proxy(self, proxy_url: str, *, max_groups: int = 1, token: str | None = None) -> int:
        """Drain a Proxy's finalized trajectories through its trajectory-read interface and queue their
        Samples; returns the sessions queued.

        This is how a RolloutManager takes trajectories from a Proxy that runs as its own service (no
        Ray in it): ``POST /trajectory/read`` with ``format: samples``, leased, ``max_groups`` prompt
        groups a read (what one answer holds in memory on both sides), until none is left (see
        :func:`~dressage.train.remote.drain`). With TQ on, the Samples carry FieldRefs; the trainers
        restore them. Each read is acknowledged once its Samples were queued; a session the ack did not
        cover (a named read took it over meanwhile, or the read was released) is withdrawn again: its
        Samples, and TQ keys, are another reader's.
        """
        queued: list[Any] = []
        try:
            for batch in drain(ProxyTrajectorySource(proxy_url, token=token, timeout_s=_READ_TIMEOUT_S),
                               max_groups=max_groups):
                added = self.rm.add_samples(batch.samples, sessions=batch.trajectories)
                queued.append(batch)
                self._count(added)
        finally:
            for batch in queued:
                unacknowledged = set(batch.unacknowledged())
                gone = [s for s in batch.samples if s.session_id in unacknowledged]
                self.rm.withdraw(gone)  # this read's Samples only: a later read may have queued the session
                self._count(gone, sign=-1)
        return sum(len(batch.acknowledged) for batch in queued)

    def _count(self, samples: list[Any], sign: int = 1) -> int:
        for s in samples:
            for name, a in s.field_arrays().items():
                self._held["large_fields" if name in _LARGE else "token_fields"] += sign * int(a.nbytes)
        return len(samples)

    def held(self) -> dict[str, int]:
        """Logical bytes of the queued Samples: materialised large fields and token fields (refs count
        zero), and ``resident``, what the queued Samples hold in all."""
        return {**self._held, "resident": self.rm.held_nbytes()}

    def take_batch_refs(self, rollout_id: int) -> tuple[list[Any], list[str], int, int]:
        """Cut the batch and ``ray.put`` each DP shard: (shard refs, TQ keys, resident bytes, samples)."""
        batch = self.rm.take_batch(rollout_id)
        self._held = {"large_fields": 0, "token_fields": 0}
        keys = sorted(sample_ref_keys(batch.samples))
        nbytes = sum(sample_resident_nbytes(s) for s in batch.samples)
        return [ray.put(shard) for shard in batch.shards], keys, nbytes, len(batch.samples)


class TrainerActor:
    """One DP rank: restores its shard from TQ and runs the consumer's checks."""

    def __init__(self, tq_spec: dict | None, model: Any) -> None:
        self.client = None
        if tq_spec is not None:
            from dressage.tq import TransferQueueClient

            self.client = TransferQueueClient.connect(tq_spec)
        self.model = model

    def consume(self, shard: list) -> tuple[dict, int]:
        before = self.client.counters.bytes_read if self.client else 0
        TrainingReader(self.client).restore(shard)
        after = self.client.counters.bytes_read if self.client else 0
        return summarise_shard(shard, self.model), after - before


@dataclass(frozen=True, kw_only=True, slots=True)
class RayBackendConfig:
    """Where the rollout and trainer actors run and what the trainers check."""

    model: ModelSpec
    """The model whose shapes every restored Sample is checked against."""
    dp_size: int = 1
    """Data-parallel ranks: one :class:`TrainerActor` each."""
    ray_address: str | None = None
    """The Ray cluster to join; ``None`` starts a fresh local one (never whatever else runs on this host)."""

    def __post_init__(self) -> None:
        if not isinstance(self.dp_size, int) or isinstance(self.dp_size, bool) or self.dp_size < 1:
            raise ConfigError(f"dp_size must be a positive integer, got {self.dp_size!r}")


def join_ray(address: str | None) -> bool:
    """Join the Ray cluster at ``address`` (``None``: start a fresh local one of 2 CPUs, never whatever else
    runs on this host) unless Ray is up already; True when this call started it (the caller shuts it
    down). An address nothing answers at, or ``auto`` with no cluster, is a ConfigError naming
    ``--ray-address`` at once rather than minutes of Ray's own retries."""
    if ray.is_initialized():
        return False
    where = "cluster.ray_address (--ray-address)"
    host, _, port = (address or "").removeprefix("ray://").rpartition(":")
    if host and port.isdigit():
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
        except OSError as exc:
            raise ConfigError(f"{where}: nothing answers at {address!r} ({exc.strerror or exc})") from None
    try:
        ray.init(address=address or "local", include_dashboard=False, log_to_driver=False,
                 **({} if address else {"num_cpus": 2}))
    except (ConnectionError, ValueError) as exc:
        raise ConfigError(f"{where}: cannot join Ray at {address!r}: {exc}") from None
    return True


class RayBackend:
    """A RolloutManager actor and one trainer actor per DP rank; Samples travel via ``ray.put``."""

    def __init__(self, cfg: RayBackendConfig, tq_spec: dict | None, client: Any) -> None:
        self._owns_ray = join_ray(cfg.ray_address)
        self.client = client
        self.rm = ray.remote(num_cpus=0)(RolloutManagerActor).remote(cfg.dp_size)
        trainer = ray.remote(num_cpus=0)(TrainerActor)
        self.trainers = [trainer.remote(tq_spec, cfg.model) for _ in range(cfg.dp_size)]

    def sink(self, done: Any) -> None:
        ray.get(self.rm.add.remote(done))

    def held_nbytes(self) -> int:
        return int(ray.get(self.rm.held.remote())["resident"])

    def train(self, rollout_id: int) -> tuple[list[dict], int, int]:
        refs, keys, rm_bytes, _ = ray.get(self.rm.take_batch_refs.remote(rollout_id))
        tasks = [t.consume.remote(ref) for t, ref in zip(self.trainers, refs)]
        # Once every rank has trained on the batch; also when one failed: the batch left the
        # RolloutManager when it was cut, so nobody else would release its keys.
        with releasing(self.client, keys):
            if tasks:  # every rank done, or failed, before the keys go: none is left mid-restore
                ray.wait(tasks, num_returns=len(tasks))
            try:
                results = ray.get(tasks)
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, DressageError):  # the rank's own typed error, e.g. a LostSamplesError
                    raise exc.cause from exc              # naming the lost Samples (dressage run's FAIL line)
                raise
        return [r[0] for r in results], rm_bytes, sum(r[1] for r in results)

    def close(self) -> None:
        for a in [self.rm, *self.trainers]:
            ray.kill(a)
        if self._owns_ray:
            ray.shutdown()


def start_ray_backend(cfg: RayBackendConfig, tq_spec: dict | None, client: Any = None) -> RayBackend:
    return RayBackend(cfg, tq_spec, client)
