"""The benchmark's hosts of the Proxy and the engine, each a process (the RolloutManager and trainer
actors are :mod:`dressage.train.ray_actors`', as ``dressage run --ray`` uses them).

They compose the library's classes (``Proxy.start``, EngineServer) so PSS can tell the components
apart; each reports its pid.
"""

from __future__ import annotations

from typing import Any

from dressage.dataplane import DataPlaneConfig
from dressage_bench.memory.proxy_process import ProxyHost

__all__ = ["ProxyActor", "EngineActor"]


class ProxyActor(ProxyHost):
    """The Proxy as a Ray actor on the master: each finalized session goes to the RolloutManager actor."""

    def __init__(self, data_plane: DataPlaneConfig, engine_url: str, rollout_manager: Any,
                 tq_spec: dict | None, spread: bool) -> None:
        self.rm = rollout_manager
        super().__init__(data_plane, engine_url, tq_spec, spread, sink=self._sink)

    def _sink(self, done: Any) -> None:
        import ray

        ray.get(self.rm.add.remote(done))


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
