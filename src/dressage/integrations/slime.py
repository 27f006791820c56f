"""Restored Dressage Samples as slime ``Sample`` objects, the fields slime's training conversion reads.

slime's ``RolloutManager._convert_samples_to_train_data`` reads ``tokens``, ``response_length``,
``get_reward_value(args)``, ``status`` (truncated or not), ``index``, ``rollout_id``,
``loss_mask`` (``response_length`` long; zeroed when ``remove_sample``), ``metadata``,
``rollout_log_probs``, ``rollout_routed_experts`` (``[len(tokens) - 1, layers, top-k]``) and
``train_metadata``. :func:`to_slime_sample` fills each of them (plus ``weight_versions``,
``group_index``, ``session_id``, ``label``, ``prompt``) on slime's own class when slime is
importable, and on :class:`SlimeSample`, a stand-in with the same fields, when it is not.

With ``keep_refs`` (``dressage_restore: trainer``) a large field still in TransferQueue stays there:
the slime Sample's attribute is ``None`` and the field's pieces ride in ``metadata["dressage_refs"]``
(:data:`REFS_METADATA_KEY`), plain lists and dicts, for :mod:`dressage.integrations.slime_train` to
restore on each training rank.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from dressage.errors import FieldShapeError, TrajectoryError
from dressage.fields.versions import VersionTable
from dressage.trajectory import Sample
from dressage.trajectory.sample_wire import SAMPLE_WIRE_VERSION, remote_to_wire

__all__ = ["SlimeSample", "slime_sample_class", "to_slime_sample", "to_slime_groups", "check_slime_sample",
           "SLIME_TRAIN_FIELDS", "status_of", "RolloutFnTrainOutput", "RolloutFnEvalOutput", "rollout_output_classes",
           "REFS_METADATA_KEY", "refs_carrier"]

REFS_METADATA_KEY = "dressage_refs"
"""The slime Sample ``metadata`` key whose value carries the refs of the fields left in TransferQueue."""

SLIME_TRAIN_FIELDS = ("tokens", "response_length", "reward", "status", "index", "rollout_id", "loss_mask",
                      "remove_sample", "metadata", "rollout_log_probs", "rollout_routed_experts",
                      "train_metadata", "weight_versions", "group_index", "session_id")
"""The slime ``Sample`` fields this adapter sets (slime/utils/types.py, slime/ray/rollout.py)."""


@dataclass
class SlimeSample:
    """slime's ``Sample`` fields, for when slime is not installed (same names, same meaning)."""

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: Any = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: Any = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_routed_experts: Any = None
    remove_sample: bool = False
    status: "SlimeSample.Status" = Status.PENDING
    metadata: dict = field(default_factory=dict)
    train_metadata: dict | None = None
    session_id: str | None = None

    def get_reward_value(self, args: Any) -> float:
        key = getattr(args, "reward_key", None)
        return self.reward if not key else self.reward[key]

    @property
    def effective_response_length(self) -> int:
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length


@dataclass
class RolloutFnTrainOutput:
    """slime's train rollout output (``slime.rollout.base_types``), for when slime is not installed."""

    samples: list
    metrics: dict[str, Any] | None = None


@dataclass
class RolloutFnEvalOutput:
    """slime's eval rollout output: ``{dataset name: {"rewards", "truncated", "samples"}}``."""

    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] | None = None


def rollout_output_classes() -> tuple[type, type]:
    """slime's ``(RolloutFnTrainOutput, RolloutFnEvalOutput)`` when slime is importable, else the stand-ins."""
    try:
        from slime.rollout.base_types import (RolloutFnEvalOutput as RealEval,  # type: ignore[import-not-found]
                                              RolloutFnTrainOutput as RealTrain)
    except ImportError:
        return RolloutFnTrainOutput, RolloutFnEvalOutput
    return RealTrain, RealEval


def slime_sample_class() -> type:
    """slime's ``Sample`` when slime is importable, else :class:`SlimeSample`."""
    try:
        from slime.utils.types import Sample as RealSample  # type: ignore[import-not-found]
    except ImportError:
        return SlimeSample
    return RealSample


def status_of(sample: Sample, cls: type) -> Any:
    """slime status: ``truncated`` for a length cut, ``aborted`` / ``failed`` when the session says so."""
    reason = sample.metadata.get("status") or sample.metadata.get("finish_reason") or "completed"
    name = {"length": "TRUNCATED", "stop": "COMPLETED", "abort": "ABORTED"}.get(str(reason), str(reason).upper())
    try:
        return cls.Status[name]
    except KeyError:
        return cls.Status.COMPLETED


def refs_carrier(sample: Sample) -> dict[str, Any]:
    """What a training rank needs to restore ``sample``'s fields still in TransferQueue: the
    Sample's id, its pieces (FieldRefs in wire form) and R3's row shape, all plain values."""
    return {"v": SAMPLE_WIRE_VERSION, "session_id": sample.session_id, "segment_index": int(sample.segment_index),
            **remote_to_wire(sample)}


def _writable_int32(a: Any) -> np.ndarray:
    """``a`` as a C-contiguous int32 array slime may write to: a copy only when it is not one already."""
    out = np.ascontiguousarray(a, dtype=np.int32)
    return out if out.flags.writeable else out.copy()


def to_slime_sample(sample: Sample, *, rollout_id: int | None = None, versions: VersionTable | None = None,
                    cls: type | None = None, label: Any = None, prompt: Any = "",
                    train_metadata: dict | None = None, remove_sample: bool | None = None,
                    keep_refs: bool = False) -> Any:
    """One restored Sample as slime's ``Sample`` (``cls`` picks the class; default: slime's if importable).

    ``weight_versions`` are the engine's strings (the Proxy records the names of named versions
    with the trajectory); ``versions`` names codes a Sample came without names for.
    Raises :class:`TrajectoryError` for a Sample whose large fields were not restored yet, unless
    ``keep_refs``: then each such field is ``None`` and its refs ride in ``metadata[REFS_METADATA_KEY]``
    (:func:`refs_carrier`).
    """
    if not sample.is_restored and not keep_refs:
        raise TrajectoryError(f"session {sample.session_id} segment {sample.segment_index}: large fields "
                              f"{sorted(sample.remote)} are still references; restore the batch first")
    cls = cls or slime_sample_class()
    labels = sample.weight_versions
    if versions is not None:
        labels = [versions.label(int(v)) if v.isdigit() else v for v in labels]
    meta = {k: v for k, v in sample.metadata.items() if k != REFS_METADATA_KEY}
    meta.setdefault("segment_index", sample.segment_index)
    if not sample.is_restored:
        meta[REFS_METADATA_KEY] = refs_carrier(sample)
    out = cls(
        group_index=sample.group_index, index=sample.index, rollout_id=rollout_id, prompt=prompt,
        tokens=[int(t) for t in sample.tokens], response_length=int(sample.response_length), label=label,
        reward=sample.reward, loss_mask=[int(m) for m in sample.loss_mask], weight_versions=labels,
        rollout_log_probs=None if sample.rollout_log_probs is None else
        [float(x) for x in np.asarray(sample.rollout_log_probs, dtype=np.float32)],
        # Writable, as under TQ (restored into arrays of its own): a wire-decoded array is a read-only view,
        # which slime's ``torch.as_tensor`` warns about and an in-place edit would fail on.
        rollout_routed_experts=None if sample.rollout_routed_experts is None else
        _writable_int32(sample.rollout_routed_experts),
        remove_sample=bool(meta.get("remove_sample", False) if remove_sample is None else remove_sample),
        metadata=meta, train_metadata=train_metadata, session_id=sample.session_id or None,
    )
    out.status = status_of(sample, cls)
    check_slime_sample(out)
    return out


def check_slime_sample(s: Any, *, num_layers: int | None = None, topk: int | None = None) -> None:
    """slime's own length rules, checked before slime asserts them mid-training."""
    n = int(s.response_length)
    if not 0 <= n <= len(s.tokens):
        raise FieldShapeError(f"response_length {n} vs {len(s.tokens)} tokens")
    if s.loss_mask is not None and len(s.loss_mask) != n:
        raise FieldShapeError(f"loss_mask has {len(s.loss_mask)} entries, response_length is {n}")
    if s.rollout_log_probs is not None and len(s.rollout_log_probs) != n:
        raise FieldShapeError(f"rollout_log_probs has {len(s.rollout_log_probs)} entries, response_length is {n}")
    r3 = s.rollout_routed_experts
    if r3 is not None:
        shape = tuple(np.shape(r3))
        if len(shape) != 3 or shape[0] != len(s.tokens) - 1:
            raise FieldShapeError(f"rollout_routed_experts is {shape}, expected [{len(s.tokens) - 1}, layers, top-k]")
        if (num_layers is not None and shape[1] != num_layers) or (topk is not None and shape[2] != topk):
            raise FieldShapeError(f"rollout_routed_experts rows are {shape[1:]}, expected ({num_layers}, {topk})")


def to_slime_groups(samples: Iterable[Sample], *, versions: VersionTable | None = None, cls: type | None = None,
                    labels: Sequence[Any] | None = None, prompts: Sequence[Any] | None = None,
                    keep_refs: bool = False) -> list[list[Any]]:
    """Samples grouped by ``group_index`` (the prompt), in group order, as slime's ``list[list[Sample]]``.

    Every segment of one session shares one ``rollout_id`` (slime averages the loss within a
    rollout); ids are 0.. in order of first appearance. ``labels`` / ``prompts`` are indexed
    by group (the data source's label and prompt of each group). ``keep_refs``: see :func:`to_slime_sample`.
    """
    cls = cls or slime_sample_class()
    groups: dict[int, list[Any]] = {}
    rollout_ids: dict[str, int] = {}
    for s in sorted(samples, key=lambda smp: smp.order_key):
        g = -1 if s.group_index is None else int(s.group_index)
        rid = rollout_ids.setdefault(s.session_id or f"#{len(rollout_ids)}", len(rollout_ids))
        label = labels[g] if labels is not None and 0 <= g < len(labels) else None
        prompt = prompts[g] if prompts is not None and 0 <= g < len(prompts) else ""
        groups.setdefault(g, []).append(to_slime_sample(s, rollout_id=rid, versions=versions, cls=cls,
                                                        label=label, prompt=prompt, keep_refs=keep_refs))
    return [groups[g] for g in sorted(groups)]
