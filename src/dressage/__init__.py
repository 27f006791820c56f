"""Dressage: a trajectory data plane for long-context agentic RL.

The names a user imports most; each layer's package has the rest (``dressage.fields``,
``dressage.trajectory``, ``dressage.tq``, ``dressage.proxy``, ``dressage.rollout``, ``dressage.train``).
"""

from dressage.errors import DressageError
from dressage.fields import MODEL_PRESETS, ModelSpec, decode_routed_experts, encode_routed_experts, get_model
from dressage.proxy.config import DataPlaneConfig
from dressage.proxy.core import FinalizedSession, ProxyCore
from dressage.rollout import RolloutBatch, RolloutManager
from dressage.train import TrainingReader, check_sample, release_batch, samples_digest, to_torch
from dressage.trajectory import (Boundary, PartialResponse, RouteDecision, Sample, Segment, Session, StepRecord,
                                 build_segments, shard_samples)
from dressage.tq import FieldRef, TransferQueue, TransferQueueClient, TransferQueueConfig

__version__ = "0.1.0"

__all__ = [
    "DressageError",
    "ModelSpec", "MODEL_PRESETS", "get_model", "encode_routed_experts", "decode_routed_experts",
    "Session", "StepRecord", "RouteDecision", "Boundary", "PartialResponse", "Segment", "build_segments",
    "Sample", "shard_samples",
    "FieldRef", "TransferQueue", "TransferQueueClient", "TransferQueueConfig",
    "DataPlaneConfig", "ProxyCore", "FinalizedSession",
    "RolloutManager", "RolloutBatch",
    "TrainingReader", "release_batch", "check_sample", "samples_digest", "to_torch",
]
