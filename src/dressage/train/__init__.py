"""Training side: after DP sharding, restore the native slime fields from TransferQueue refs."""

from dressage.train.digest import combine_digests, sample_digest, samples_digest
from dressage.train.checks import check_sample
from dressage.train.reader import TrainingReader, release_batch, releasing, to_torch

__all__ = ["TrainingReader", "release_batch", "releasing", "to_torch", "samples_digest", "sample_digest", "combine_digests", "check_sample"]
