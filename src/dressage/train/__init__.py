"""Training side: after DP sharding, restore the native slime fields from TransferQueue refs."""

from dressage.train.digest import samples_digest
from dressage.train.reader import TrainingReader, release_batch, to_torch

__all__ = ["TrainingReader", "release_batch", "to_torch", "samples_digest"]
