"""The main job: engine + Proxy + TQ + agents -> RolloutManager -> DP shards -> restored Samples."""

from dressage.run.config import RunConfig
from dressage.run.loop import RunReport, run_pipeline

__all__ = ["RunConfig", "RunReport", "run_pipeline"]
