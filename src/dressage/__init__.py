"""Dressage: a trajectory data plane for long-context agentic RL.

The names a user imports most, re-exported lazily: ``import dressage.rollout`` in a Ray actor must
not pull in ZMQ, the HTTP stack or the TransferQueue (every process's idle memory counts).
Each layer's package has the rest (``dressage.fields``, ``dressage.trajectory``, ``dressage.tq``,
``dressage.proxy``, ``dressage.rollout``, ``dressage.train``).
"""

from __future__ import annotations

from dressage._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "DressageError": "dressage.errors",
    "ModelSpec": "dressage.fields", "MODEL_PRESETS": "dressage.fields", "get_model": "dressage.fields",
    "encode_routed_experts": "dressage.fields", "decode_routed_experts": "dressage.fields",
    "Session": "dressage.trajectory", "StepRecord": "dressage.trajectory", "RouteDecision": "dressage.trajectory",
    "Boundary": "dressage.trajectory", "PartialResponse": "dressage.trajectory", "Segment": "dressage.trajectory",
    "build_segments": "dressage.trajectory", "Sample": "dressage.trajectory", "shard_samples": "dressage.trajectory",
    "FieldRef": "dressage.tq", "TransferQueue": "dressage.tq", "TransferQueueClient": "dressage.tq",
    "TransferQueueConfig": "dressage.tq",
    "DataPlaneConfig": "dressage.dataplane", "ProxyCore": "dressage.proxy.recording.core",
    "FinalizedSession": "dressage.proxy.recording.core",
    "RolloutManager": "dressage.rollout", "RolloutBatch": "dressage.rollout",
    "TrainingReader": "dressage.train", "release_batch": "dressage.train", "check_sample": "dressage.train",
    "samples_digest": "dressage.train", "to_torch": "dressage.train",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
