"""The benchmark's Ray actors for the Proxy and the engine, each a process (the RolloutManager and
trainer actors are :mod:`dressage.train.ray_actors`', as ``dressage run --ray`` uses them).

They compose the library's classes (``Proxy.start``, EngineServer) so PSS can tell the components
apart; each reports its pid.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import ray

from dressage.dataplane import DataPlaneConfig

__all__ = ["ProxyActor", "EngineActor"]


class ProxyActor:
    """The Proxy (``Proxy.start``) in its own process; finalized sessions go to the RM actor."""

    def __init__(self, data_plane: DataPlaneConfig, engine_url: str, rollout_manager: Any,
                 tq_spec: dict | None, spread: bool) -> None:
        from dressage.proxy.config import ProxyConfig, ProxyServerConfig
        from dressage.proxy.deployment import Proxy

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
        self.proxy = Proxy.start(ProxyConfig(data_plane=data_plane, server=ProxyServerConfig(engine_url=engine_url)),
                                 tq_client=self.client, sink=self._sink, batch_tag=lambda: f"rollout-{self.rollout_id}")
        self.core, self.service, self._url = self.proxy.core, self.proxy.service, self.proxy.url

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

    def state_sizes(self) -> dict[str, int]:
        """Sizes of the Proxy's per-session state and of its write-behind (what it keeps across batches)."""
        core = self.core
        behind = getattr(core, "_behind", None)
        out = {"sessions": len(core.sessions), "calls": len(getattr(core, "_calls", {})),
               "gone": len(getattr(core, "_gone", {})), "finalized": len(getattr(self.service, "finalized", {})),
               "gc_objects": len(gc.get_objects()),
               "heap_trims": getattr(self.service, "heap_trims", 0),
               "heap_trim_ms": round(getattr(self.service, "heap_trim_s", 0.0) * 1e3, 3)}
        if behind is not None:
            out.update(write_behind_pending=behind.pending(), write_behind_failures=behind.failures,
                       put_rounds=behind.batcher.rounds, put_steps=behind.batcher.steps)
        return out

    def forget_finished(self) -> int:
        """Drop finished sessions once the trainer consumed their Samples."""
        done = [sid for sid, s in self.core.sessions.items() if s.state != "active"]
        self.service.forget(done)
        return len(done)

    def stop(self) -> None:
        self.proxy.shutdown()
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
