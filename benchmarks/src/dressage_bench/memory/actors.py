"""The benchmark's Ray actors: the Proxy's HTTP server, the RolloutManager and the engine, each a process.

They compose the library's classes (ProxyServer, RolloutManager, EngineServer) so PSS can tell the
components apart; each reports its pid. The RolloutManager ``ray.put``s one object per DP shard, as slime
does: with TQ off those objects carry every field, with TQ on only token fields and FieldRefs.
"""

from __future__ import annotations

import os
from typing import Any

import ray

from dressage.proxy.config import DataPlaneConfig
from dressage.rollout import RolloutManager
from dressage.rollout.manager import sample_ref_keys, sample_resident_nbytes

__all__ = ["ProxyActor", "RolloutManagerActor", "EngineActor"]

_LARGE = ("rollout_log_probs", "rollout_routed_experts")


class RolloutManagerActor:
    """The master's RolloutManager: Samples accumulate here until the batch is cut and put per shard."""

    def __init__(self, dp_size: int) -> None:
        self.rm = RolloutManager(dp_size=dp_size)
        self._held = {"large_fields": 0, "token_fields": 0}

    def pid(self) -> int:
        return os.getpid()

    def add(self, done: Any) -> int:
        samples = self.rm.add_finalized(done)
        for s in samples:
            for name, a in s.field_arrays().items():
                kind = "large_fields" if name in _LARGE else "token_fields"
                self._held[kind] += int(a.nbytes)
        return len(samples)

    def held(self) -> dict[str, int]:
        """Logical bytes of the queued Samples: materialised large fields and token fields (refs count zero)."""
        return dict(self._held)

    def take_batch_refs(self, rollout_id: int) -> tuple[list[Any], list[str], int, int]:
        """Cut the batch and ``ray.put`` each DP shard: (shard refs, TQ keys, resident bytes, samples)."""
        batch = self.rm.take_batch(rollout_id)
        self._held = {"large_fields": 0, "token_fields": 0}
        keys = sorted(sample_ref_keys(batch.samples))
        nbytes = sum(sample_resident_nbytes(s) for s in batch.samples)
        refs = [ray.put(shard) for shard in batch.shards]
        return refs, keys, nbytes, len(batch.samples)


class ProxyActor:
    """The Proxy (ProxyCore + ProxyService + ProxyServer) in its own process; finalized sessions go to the RM."""

    def __init__(self, data_plane: DataPlaneConfig, engine_url: str, rollout_manager: Any,
                 tq_spec: dict | None, spread: bool) -> None:
        from dressage.proxy.core import ProxyCore
        from dressage.proxy.server import ProxyServer, ProxyServerConfig, ProxyService
        from dressage.proxy.sglang_client import SGLangClient
        from dressage.tokenizer import load_tokenizer

        self.client = None
        if tq_spec is not None:
            from dressage.tq import TransferQueueClient

            self.client = TransferQueueClient.connect(tq_spec)
            if spread:
                # No node preference: the Controller places each step on the unit with the most room,
                # so keys spread evenly over every node's StorageUnit.
                self.client.node_id = None
        self.rm = rollout_manager
        self.rollout_id = 0
        tok = load_tokenizer("byte")
        self.core = ProxyCore(data_plane, self.client, sink=self._sink, decode=tok.decode,
                              special_ids=tok.special_token_ids, batch_tag=lambda: f"rollout-{self.rollout_id}")
        self.service = ProxyService(ProxyServerConfig(engine_url=engine_url), self.core, tok,
                                    SGLangClient(engine_url))
        self.server = ProxyServer(self.service)
        self._url = self.server.start_background()

    def _sink(self, done: Any) -> None:
        ray.get(self.rm.add.remote(done))

    def url(self) -> str:
        return self._url

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def set_rollout(self, rollout_id: int) -> None:
        self.rollout_id = rollout_id
        self.service.weight_version = rollout_id

    def held(self) -> dict[str, int]:
        """Logical bytes the Proxy holds itself: large-field arrays and resident token fields of its steps."""
        return self.core.held_bytes()

    def forget_finished(self) -> int:
        """Drop finished sessions once the trainer consumed their Samples."""
        done = [sid for sid, s in self.core.sessions.items() if s.state != "active"]
        self.service.forget(done)
        return len(done)

    def stop(self) -> None:
        self.server.stop()
        if self.client is not None:
            self.client.close()


class EngineActor:
    """The SGLang-protocol engine in its own process on node 1 (it drives the plane; outside the metric)."""

    def __init__(self, config: Any) -> None:
        from dressage.engine.server import EngineServer

        self.server = EngineServer(config)
        self._url = self.server.start_background()

    def url(self) -> str:
        return self._url

    def stop(self) -> None:
        self.server.stop()
