"""Rollout layer: the RolloutManager turns finalized sessions into Samples and hands batches to training."""

from dressage.rollout.manager import RolloutBatch, RolloutManager

__all__ = ["RolloutManager", "RolloutBatch"]
