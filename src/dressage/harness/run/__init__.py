"""The main job: engine + Proxy + TQ + agents -> RolloutManager -> DP shards -> restored Samples.

``RunConfig`` imports nothing but the configs, so ``dressage --help`` works without the server
extra; the loop (engine, Proxy, HTTP) is imported when first asked for.
"""

from typing import Any

from dressage.harness.run.config import RunConfig

__all__ = ["RunConfig", "RunReport", "run_pipeline"]


def __getattr__(name: str) -> Any:
    if name in ("RunReport", "run_pipeline"):
        from dressage.harness.run import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'dressage.harness.run' has no attribute {name!r}")
