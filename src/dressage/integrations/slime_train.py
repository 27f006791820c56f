"""slime training with refs past DP sharding (``dressage_restore: trainer``): each rank restores its own.

The rollout function leaves the large fields in TransferQueue (:func:`~dressage.integrations.slime.to_slime_sample`
with ``keep_refs``); :func:`convert_samples_to_train_data` (slime's ``--custom-convert-samples-to-train-data-path``)
builds slime's train data with the refs under a key slime's DP split passes through; on each training rank
:func:`restore_rollout_data` reads that rank's refs, one batched read per StorageUnit, and fills
``rollout_log_probs`` / ``rollout_routed_experts`` as the path without refs has them; :class:`RankRefs`
releases them after the step; a rank finds the TransferQueue by asking the Proxy (:func:`tq_spec`).
``python -m dressage.integrations.slime_train`` is slime's ``train.py`` with a training actor that does
both and a Proxy paused around each weight update (:class:`ProxyRolloutControl`).
Everything that needs slime, Megatron or Ray is imported where it is used, so the rest runs on CPU alone.
"""

from __future__ import annotations

import contextvars
import importlib
import itertools
import logging
import os
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from dressage.errors import ConfigError, DressageError, FieldShapeError, SampleWireError, TrajectoryError
from dressage.integrations.slime import REFS_METADATA_KEY
from dressage.integrations.slime_config import TRAIN_ENTRY_MARK, trainer_metrics_address, trainer_proxy
from dressage.train.reader import TrainingReader, release_batch
from dressage.trajectory import SAMPLE_LARGE_FIELDS, Sample
from dressage.trajectory.sample_wire import SAMPLE_WIRE_VERSION, remote_from_wire

__all__ = ["convert_samples_to_train_data", "restore_rollout_data", "carried_keys", "post_process_rewards",
           "RankRefs", "ProxyRolloutControl", "REFS_TRAIN_KEY", "dressage_train_actor", "tq_spec", "unscheduled_samples",
           "train", "main"]

REFS_TRAIN_KEY = "prompt"
"""The train-data key the refs ride under. slime's ``_split_train_data_by_dp`` copies a fixed list of keys
into each rank's ``rollout_data``, indexed by the rank's partition; of those, ``prompt`` is per sample, is
left as it is by ``tensorize_rollout_data_for_training`` (it converts tokens, masks and log-probs only),
is never set by slime's own conversion and is read by no training code. A key of our own would be dropped
by the split, and a tensorized one would not hold dicts. :func:`restore_rollout_data` removes it again."""

_FIELDS = tuple(SAMPLE_LARGE_FIELDS.items())  # (Segment field name, slime train-data key)
_GROUP_NORMALISED = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
_STD_NORMALISED = ("grpo", "gspo", "cispo")


# ------------------------------------------------------------------ RolloutManager side
def post_process_rewards(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """``(raw_rewards, rewards)``: the user's ``args.custom_reward_post_process_path`` when given, else
    Dressage's per-session post-processing (:mod:`dressage.integrations.slime_rewards`), else slime's group
    normalisation."""
    path = getattr(args, "custom_reward_post_process_path", None)
    if path:
        return _load_function(path)(args, samples)
    try:
        from dressage.integrations.slime_rewards import reward_post_process  # type: ignore[attr-defined]
    except ImportError:
        reward_post_process = None
    if reward_post_process is not None:
        return reward_post_process(args, samples)
    raw = [s.get_reward_value(args) for s in samples]
    if getattr(args, "advantage_estimator", None) not in _GROUP_NORMALISED or \
            not getattr(args, "rewards_normalization", False):
        return raw, raw
    import torch

    rewards = torch.tensor(raw, dtype=torch.float)
    n = getattr(args, "n_samples_per_prompt", None)
    batch = getattr(args, "rollout_batch_size", None)
    # Whole groups of n: normalise per prompt; otherwise (groups of other sizes) over the batch.
    rewards = rewards.reshape(-1, n) if n and batch and rewards.shape[-1] == n * batch else rewards.view(-1, len(raw))
    rewards = rewards - rewards.mean(dim=-1, keepdim=True)
    if args.advantage_estimator in _STD_NORMALISED and getattr(args, "grpo_std_normalization", False):
        rewards = rewards / (rewards.std(dim=-1, keepdim=True) + 1e-6)
    return raw, rewards.flatten().tolist()


def _load_function(path: str) -> Any:
    module, _, name = str(path).rpartition(".")
    if not module:
        raise ConfigError(f"custom_reward_post_process_path: expected module.function, got {path!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"custom_reward_post_process_path: cannot load {path!r}: {exc}") from exc


def _flat(samples: Sequence[Any]) -> list[Any]:
    out = list(samples)
    while out and isinstance(out[0], (list, tuple)):
        out = list(itertools.chain.from_iterable(out))
    return out


def _rollout_ids(samples: Sequence[Any]) -> list[int]:
    """Each sample's ``rollout_id``; one without gets an id no other sample uses (slime's rule)."""
    ids = [s.rollout_id for s in samples]
    used = {i for i in ids if i is not None}
    free = (i for i in itertools.count() if i not in used)
    return [next(free) if i is None else i for i in ids]


def _per_field(samples: Sequence[Any], attr: str) -> bool:
    """Whether the batch carries ``attr`` resident (all samples) or not at all; a mix is an error."""
    have = [getattr(s, attr, None) is not None for s in samples]
    if any(have) and not all(have):
        raise TrajectoryError(f"{attr}: {sum(have)} of {len(have)} Samples hold it, the others left it in "
                              "TransferQueue; restore a batch one way (all in the rollout or all on the trainer)")
    return bool(have) and have[0]


def convert_samples_to_train_data(args: Any, samples: Sequence[Any]) -> dict[str, Any]:
    """slime's train data for ``samples`` (slime Samples, flat or grouped), as slime's own conversion
    builds it, plus the refs of fields left in TransferQueue under :data:`REFS_TRAIN_KEY`."""
    samples = _flat(samples)
    if not samples:
        raise TrajectoryError("convert_samples_to_train_data: no samples")
    raw_rewards, rewards = post_process_rewards(args, samples)
    if len(raw_rewards) != len(samples) or len(rewards) != len(samples):
        raise TrajectoryError(f"reward post-processing gave {len(raw_rewards)} raw / {len(rewards)} rewards "
                              f"for {len(samples)} samples")
    truncated = type(samples[0]).Status.TRUNCATED
    data: dict[str, Any] = {
        "tokens": [s.tokens for s in samples], "response_lengths": [s.response_length for s in samples],
        "rewards": rewards, "raw_reward": raw_rewards,
        "truncated": [1 if s.status == truncated else 0 for s in samples],
        "sample_indices": [s.index for s in samples], "rollout_ids": _rollout_ids(samples),
    }
    masks = []
    for s in samples:
        if s.loss_mask is None:
            s.loss_mask = [1] * s.response_length
        if len(s.loss_mask) != s.response_length:
            raise FieldShapeError(f"loss_mask has {len(s.loss_mask)} entries, response_length is {s.response_length}")
        if s.remove_sample:
            s.loss_mask = [0] * s.response_length
        masks.append(s.loss_mask)
    data["loss_masks"] = masks
    # Each sample carries its whole rollout's mask total: the loss divides by it wherever the
    # rollout's samples land among micro-batches.
    totals: dict[int, int] = {}
    for rid, m in zip(data["rollout_ids"], masks):
        totals[rid] = totals.get(rid, 0) + sum(m)
    data["rollout_mask_sums"] = [totals[rid] for rid in data["rollout_ids"]]
    if any(s.metadata and "raw_reward" in s.metadata for s in samples):
        data["raw_reward"] = [s.metadata["raw_reward"] if s.metadata and "raw_reward" in s.metadata else s.reward
                              for s in samples]
    if samples[0].metadata and "round_number" in samples[0].metadata:
        data["round_number"] = [s.metadata["round_number"] for s in samples]
    if _per_field(samples, "rollout_log_probs"):
        data["rollout_log_probs"] = [s.rollout_log_probs for s in samples]
    if _per_field(samples, "rollout_routed_experts"):
        data["rollout_routed_experts"] = _as_tensors([s.rollout_routed_experts for s in samples])
    if samples[0].train_metadata is not None:
        data["metadata"] = [s.train_metadata for s in samples]
    if any(getattr(s, "multimodal_train_inputs", None) is not None for s in samples):
        data["multimodal_train_inputs"] = [getattr(s, "multimodal_train_inputs", None) for s in samples]
    if getattr(samples[0], "teacher_log_probs", None) is not None:
        data["teacher_log_probs"] = [s.teacher_log_probs for s in samples]
    if samples[0].metadata is not None:
        data["source_names"] = [getattr(s, "source", None) or (s.metadata or {}).get("source_name") or "unknown"
                                for s in samples]
    carriers = [(s.metadata or {}).get(REFS_METADATA_KEY) for s in samples]
    if any(c is not None for c in carriers):
        data[REFS_TRAIN_KEY] = carriers
        _release_unscheduled(args, data)
    return data


def unscheduled_samples(rollout_ids: Sequence[int], global_batch_size: int | None) -> list[int]:
    """The positions of the samples slime's DP schedule trains on no rank: it cuts the rollouts (in
    the order their first sample comes) into steps of ``global_batch_size`` rollouts, and the trailing
    rollouts that fill no step are dropped with all their samples."""
    if not global_batch_size:
        return []
    order = list(dict.fromkeys(rollout_ids))
    kept = set(order[:len(order) // int(global_batch_size) * int(global_batch_size)])
    return [i for i, rid in enumerate(rollout_ids) if rid not in kept]


def _release_unscheduled(args: Any, data: Mapping[str, Any]) -> int:
    """Release the TransferQueue keys only samples that slime's schedule drops refer to (a
    ``--global-batch-size`` that does not divide the rollout's rollouts): no rank reads or releases them."""
    dropped = set(unscheduled_samples(data["rollout_ids"], getattr(args, "global_batch_size", None)))
    if not dropped:
        return 0
    carriers = data[REFS_TRAIN_KEY]

    def keys(positions: Any) -> set[str]:
        return set(carried_keys({REFS_TRAIN_KEY: [carriers[i] for i in positions]}))

    orphans = sorted(keys(dropped) - keys(i for i in range(len(carriers)) if i not in dropped))
    log = logging.getLogger(__name__)
    log.warning("global_batch_size %s: slime's schedule trains no rank on %d of %d samples (trailing rollouts that "
                "fill no step); releasing the %d TransferQueue keys only they refer to", args.global_batch_size,
                len(dropped), len(carriers), len(orphans))
    try:
        return _release_keys(args, orphans)
    except DressageError as exc:  # a clean-up: the conversion stands, and retention sweeps what is left
        log.warning("could not release the %d keys of the samples slime drops (TQ's retention sweeps them): %s",
                    len(orphans), exc)
        return 0


def _as_tensors(arrays: list[Any]) -> list[Any]:
    try:
        import torch
    except ImportError:
        return [np.asarray(a) for a in arrays]
    # A read-only array (one decoded straight from the read's bytes) is copied: a tensor may be written to.
    return [torch.as_tensor(a if not isinstance(a, np.ndarray) or a.flags.writeable else a.copy()) for a in arrays]


# ------------------------------------------------------------------ training-rank side
def _sample_of(carrier: Any, tokens: Any, response_length: Any, where: str) -> Sample:
    if not isinstance(carrier, Mapping) or carrier.get("v") != SAMPLE_WIRE_VERSION:
        raise SampleWireError(f"{where}: not a Dressage refs carrier (v={SAMPLE_WIRE_VERSION}): {str(carrier)[:120]}")
    remote, trailing = remote_from_wire(carrier)
    tokens = np.asarray(tokens.numpy() if hasattr(tokens, "numpy") else tokens, dtype=np.int32).reshape(-1)
    n = int(response_length)
    sample = Sample(tokens=tokens, response_length=n, loss_mask=np.zeros(n, np.int8),
                    token_versions=np.zeros(n, np.int32), session_id=str(carrier.get("session_id", "")),
                    segment_index=int(carrier.get("segment_index") or 0), r3_trailing=trailing)
    sample.remote.update(remote)
    return sample


def _ref_keys(samples: Sequence[Sample]) -> list[str]:
    return sorted({p.value.key for s in samples for pieces in s.remote.values() for p in pieces
                   if hasattr(p, "value") and hasattr(p.value, "key")})


def carried_keys(rollout_data: Mapping[str, Any]) -> list[str]:
    """The TransferQueue keys a rank's ``rollout_data`` refers to, without reading them (to release
    a step's keys that no rank restored)."""
    carriers = rollout_data.get(REFS_TRAIN_KEY) or []
    return _ref_keys([_sample_of(c, [], 0, f"{REFS_TRAIN_KEY}[{i}]") for i, c in enumerate(carriers)
                      if c is not None])


def restore_rollout_data(rollout_data: dict[str, Any], reader: TrainingReader) -> list[str]:
    """Restore one rank's ``rollout_data`` in place from the refs under :data:`REFS_TRAIN_KEY`.

    One ``get_many`` for the whole rank (one round trip per StorageUnit; keys shared by several
    Segments of a session read once), then ``rollout_log_probs`` (float32 over the response) and
    ``rollout_routed_experts`` (int32 ``[T-1, layers, top-k]``) per sample, as torch tensors when
    the rank's tokens are (what slime's tensorize step made of the path without refs), else arrays.
    Returns the TransferQueue keys read, for :func:`release_batch` after the step.
    """
    carriers = rollout_data.get(REFS_TRAIN_KEY)
    if carriers is None:
        return []
    if reader.on_lost != "fail":
        raise ConfigError(f"restore_rollout_data: a slime rank trains on its whole partition; on_lost must be "
                          f"'fail', got {reader.on_lost!r}")
    tokens, lengths = rollout_data["tokens"], rollout_data["response_lengths"]
    if not len(carriers) == len(tokens) == len(lengths):
        raise FieldShapeError(f"rollout_data: {len(carriers)} refs carriers for {len(tokens)} samples")
    samples = [None if c is None else _sample_of(c, t, n, f"{REFS_TRAIN_KEY}[{i}]")
               for i, (c, t, n) in enumerate(zip(carriers, tokens, lengths))]
    held = [s for s in samples if s is not None]
    if not held:
        rollout_data.pop(REFS_TRAIN_KEY)
        return []
    keys = _ref_keys(held)
    reader.restore(held)
    as_torch = _torch_if_tensors(tokens)
    filled: dict[str, list[Any]] = {}
    for _, key in _FIELDS:
        got = [s is not None and getattr(s, key) is not None for s in samples]
        if not any(got):
            continue
        if not all(got) or key in rollout_data:
            raise TrajectoryError(f"{key}: carried as refs for {sum(got)} of {len(got)} samples of this rank; "
                                  "a batch carries each large field one way")
        values = []
        for i, s in enumerate(samples):
            a = getattr(s, key)
            _check_restored(key, a, s, i)
            # The reader joins each Sample's pieces into a new array: the tensor shares it, no copy.
            values.append(a if as_torch is None else as_torch.from_numpy(a))
        filled[key] = values
    rollout_data.update(filled)  # all fields or none: a bad one leaves the rank's data as it came
    rollout_data.pop(REFS_TRAIN_KEY)
    return keys


def _torch_if_tensors(tokens: Sequence[Any]) -> Any:
    if not tokens or type(tokens[0]).__module__.split(".")[0] != "torch":
        return None
    import torch

    return torch


def _check_restored(key: str, a: np.ndarray, s: Sample, i: int) -> None:
    want = (s.response_length,) if key == "rollout_log_probs" else (s.total_length - 1,)
    if a.shape[:1] != want:
        raise FieldShapeError(f"{key}[{i}] ({s.session_id}#{s.segment_index}): restored {a.shape}, "
                              f"expected {want[0]} rows")


class RankRefs:
    """One training rank's TransferQueue refs: :meth:`take` restores a ``rollout_data``, :meth:`release`
    deletes what was read once the step is over.

    A rank may release its keys as soon as its own step returns: every DP rank's step ends in the
    same gradient all-reduce, which none passes before all ranks restored their data, so a key two
    ranks share is read by both before either deletes it.
    """

    def __init__(self, client: Any, *, reader: TrainingReader | None = None, metrics: Any = None) -> None:
        self.client = client
        self.metrics = metrics
        """A :class:`~dressage.train.metrics.RestoreMetrics` the restores and releases count into, if any."""
        self.reader = reader or TrainingReader(client, metrics=metrics)
        self.pending: list[str] = []

    def take(self, rollout_data: dict[str, Any]) -> dict[str, Any]:
        self.pending += restore_rollout_data(rollout_data, self.reader)
        return rollout_data

    def release(self) -> int:
        keys, self.pending = sorted(set(self.pending)), []
        return release_batch(self.client, keys, metrics=self.metrics) if keys else 0


# ------------------------------------------------------------------ the Proxy around a weight update
class ProxyRolloutControl:
    """``POST /v1/rollout/pause`` and ``/resume`` on a Proxy: sessions that span a weight update
    wait instead of generating with half-updated weights, and resume under the new version."""

    def __init__(self, proxy_url: str, *, token: str | None = None, timeout_s: float = 120.0) -> None:
        from dressage.train.remote import ProxyTrajectorySource

        # The trajectory source's poster: one place that speaks HTTP to a Proxy and translates its failures.
        self._http = ProxyTrajectorySource(proxy_url, token=token, timeout_s=timeout_s)

    @property
    def url(self) -> str:
        return self._http.url

    def pause(self, *, reason: str | None = "update_weights") -> dict[str, Any]:
        return self._http._post("/v1/rollout/pause", {} if reason is None else {"reason": reason})

    def resume(self, weight_version: int | str | None = None, *, update_engines: bool = False,
               reason: str | None = "update_weights") -> dict[str, Any]:
        body: dict[str, Any] = {"update_engines": update_engines}
        if weight_version is not None:
            body["version"] = weight_version
        if reason is not None:
            body["reason"] = reason
        return self._http._post("/v1/rollout/resume", body)

    @contextmanager
    def paused(self, weight_version: int | str | None = None) -> Iterator[None]:
        """Paused for the block; resumed under ``weight_version`` when it succeeds. A failed update
        leaves the Proxy paused: resuming would record tokens of unknown weights under a version."""
        self.pause()
        yield
        self.resume(weight_version)


# ------------------------------------------------------------------ slime's entry (needs slime, Ray, Megatron)
_TAKING: contextvars.ContextVar[RankRefs | None] = contextvars.ContextVar("dressage_taking", default=None)
"""The rank whose ``_get_rollout_data`` runs in this thread (context), if any."""

_WRAPPING = threading.Lock()


def _restoring_fetch(module: Any) -> None:
    """Wrap ``module.process_rollout_data`` (once per process) so that, inside a rank's ``_get_rollout_data``,
    the data it fetched comes back restored; anywhere else the wrapper answers what slime's function does."""
    with _WRAPPING:
        fetch = module.process_rollout_data
        if getattr(fetch, "__dressage_restores__", False):
            return

        def process_rollout_data(*args: Any, **kwargs: Any) -> Any:
            data = fetch(*args, **kwargs)
            refs = _TAKING.get()
            return data if refs is None else refs.take(data)

        process_rollout_data.__dressage_restores__ = True  # type: ignore[attr-defined]
        process_rollout_data.__wrapped__ = fetch  # type: ignore[attr-defined]
        module.process_rollout_data = process_rollout_data


def dressage_train_actor(base: type | None = None) -> type:
    """slime's Megatron training actor, restoring its rank's refs when it takes its rollout data and
    releasing them after the step. ``base`` defaults to slime's ``MegatronTrainRayActor``; the rank joins
    the Proxy's TransferQueue (:func:`tq_spec`: by default it asks the Proxy of ``args.dressage_proxy_url``)
    on its first step.

    Ray ships the class to each actor's process by value (it is made here, not importable by name): its
    methods only call this module's functions, which travel by reference, and everything with state (the
    fetch's wrapping, the rank's TransferQueue client) is set up there, on the actor's first step."""
    if base is None:
        from slime.backends.megatron_utils.actor import MegatronTrainRayActor as base  # type: ignore

    class DressageTrainRayActor(base):  # type: ignore[misc, valid-type]
        _dressage_fetch_module = base.__module__
        _dressage_refs: RankRefs | None = None
        _dressage_metrics: Any = None

        def _get_rollout_data(self, rollout_data_ref: Any) -> Any:
            return _take_rollout_data(self, super()._get_rollout_data, rollout_data_ref)

        def train(self, rollout_id: int, rollout_data_ref: Any, external_data: Any = None) -> Any:
            out = super().train(rollout_id, rollout_data_ref, external_data=external_data)
            # After a failed step the keys stay (a retry reads them again; TQ's retention sweeps them).
            _rank_refs(self).release()
            return out

    return DressageTrainRayActor


def _take_rollout_data(actor: Any, fetch: Any, rollout_data_ref: Any) -> Any:
    """``fetch(rollout_data_ref)`` (slime's ``_get_rollout_data``) with the data restored for ``actor``'s rank.

    slime's ``_get_rollout_data`` fetches the rank's data through its module's ``process_rollout_data`` and
    moves it to the GPU in the same method; the refs must be restored in between, so that name is wrapped,
    in the actor's own process, and the wrapper restores for the actor whose ``_get_rollout_data`` is running
    (a context variable: actors that share a process, or threads of one actor, each restore their own)."""
    _restoring_fetch(importlib.import_module(actor._dressage_fetch_module))
    token = _TAKING.set(_rank_refs(actor))
    try:
        return fetch(rollout_data_ref)
    finally:
        _TAKING.reset(token)


def _rank_refs(actor: Any) -> RankRefs:
    """The actor's :class:`RankRefs`, joined to the TransferQueue on first use."""
    if actor._dressage_refs is None:
        client = _tq_client(actor.args)
        metrics, actor._dressage_metrics = _rank_metrics(actor.args, client)
        actor._dressage_refs = RankRefs(client, metrics=metrics)
    return actor._dressage_refs


def _rank_metrics(args: Any, client: Any) -> tuple[Any, Any]:
    """The rank's :class:`~dressage.train.metrics.RestoreMetrics` and the endpoint serving it, when the
    config names a metrics port (:func:`~dressage.integrations.slime_config.trainer_metrics_address`)."""
    address = trainer_metrics_address(args)
    if address is None:
        return None, None
    from dressage.train.metrics import RestoreMetrics

    metrics = RestoreMetrics(client)
    endpoint = metrics.serve(*address)
    logging.getLogger(__name__).info("training rank metrics at %s", endpoint.url)
    return metrics, endpoint


def tq_spec(args: Any) -> dict[str, Any]:
    """The TransferQueue client spec a training rank joins: ``args.dressage_tq_spec`` (a spec, or the path
    of a spec file), else the file ``DRESSAGE_TQ_SPEC`` names, else the Proxy's own: ``GET
    /transfer_queue/spec`` on ``args.dressage_proxy_url`` (or ``DRESSAGE_PROXY_URL``) with the admin token
    (:func:`~dressage.integrations.slime_config.trainer_proxy`), the spec its reads hand out."""
    from dressage.tq.client.spec import load_client_spec

    spec = getattr(args, "dressage_tq_spec", None)
    if spec is None:
        spec = os.environ.get("DRESSAGE_TQ_SPEC") or None
    if isinstance(spec, Mapping):
        return dict(spec)
    if isinstance(spec, (str, os.PathLike)):
        return load_client_spec(spec)
    if spec is not None:
        raise ConfigError(f"dressage_tq_spec: expected a TransferQueue client spec (a map) or the path of its file, "
                          f"got {type(spec).__name__}")
    url, token = trainer_proxy(args)
    if url is None:
        raise ConfigError("dressage_restore: trainer: the training ranks ask the Proxy for its TransferQueue; set "
                          "dressage_proxy_url (the --custom-config-path YAML) or DRESSAGE_PROXY_URL, or give the "
                          "client spec itself (dressage_tq_spec, DRESSAGE_TQ_SPEC)")
    from dressage.train.remote import ProxyTrajectorySource

    return ProxyTrajectorySource(url, token=token).transfer_queue_spec()


def _tq_client(args: Any) -> Any:
    from dressage.tq import TransferQueueClient

    return TransferQueueClient.connect(tq_spec(args))


def _release_untrained(args: Any, rollout_data_refs: Sequence[Any]) -> int:
    """Release a step's keys that no rank restored (a critic-only step: the actor did not train)."""
    import ray

    return _release_keys(args, sorted({k for box in rollout_data_refs for k in carried_keys(ray.get(box.inner))}))


def _release_keys(args: Any, keys: Sequence[str]) -> int:
    if not keys:
        return 0
    client = _tq_client(args)
    try:
        return release_batch(client, keys)
    finally:
        client.close()


def train(args: Any, *, control: ProxyRolloutControl | None = None) -> None:
    """slime's ``train.py`` loop with :func:`dressage_train_actor` and, given ``control``, the Proxy
    paused around each ``update_weights``."""
    import ray
    from slime.observability.logging_utils import configure_logger, finish_tracking, init_tracking  # type: ignore
    from slime.ray.placement_group import (  # type: ignore
        create_placement_groups, create_rollout_manager, create_training_models)
    from slime.utils.misc import should_run_periodic_action  # type: ignore

    # Before the RolloutManager is created with these args: its rollout function refuses dressage_restore:
    # trainer without the mark (under slime's train.py no actor would restore or release the refs).
    setattr(args, TRAIN_ENTRY_MARK, True)
    configure_logger()
    pgs = create_placement_groups(args)
    init_tracking(args)
    rollout_manager, per_epoch = create_rollout_manager(args, pgs["rollout"])
    actor_model, critic_model = create_training_models(args, pgs, rollout_manager, actor_cls=dressage_train_actor())
    version = getattr(args, "update_weight_start_version", 0) or 0

    def update_weights() -> None:
        nonlocal version
        if control is None:
            actor_model.update_weights()
        else:
            with control.paused(version + 1):
                actor_model.update_weights()
        version += 1  # slime's updater counts one version per update

    if args.offload_rollout and not args.release_train:
        ray.get(rollout_manager.onload_weights.remote())
    update_weights()
    if args.offload_rollout:
        ray.get(rollout_manager.onload_kv.remote())
    if args.num_rollout == 0 and args.eval_interval is not None:
        ray.get(rollout_manager.eval.remote(rollout_id=0))
    for rollout_id in range(args.start_rollout_id, args.num_rollout):
        if args.eval_interval is not None and rollout_id == 0 and not args.skip_eval_before_train:
            ray.get(rollout_manager.eval.remote(rollout_id))
        data_ref = ray.get(rollout_manager.generate.remote(rollout_id))
        if args.offload_rollout:
            ray.get(rollout_manager.offload.remote())
        if args.release_train:
            actor_model.create()
        actor_trains = not args.use_critic or rollout_id >= args.num_critic_only_steps
        if args.use_critic:
            values = critic_model.async_train(rollout_id, data_ref)
            if actor_trains:
                ray.get(actor_model.async_train(rollout_id, data_ref, external_data=values))
            else:
                ray.get(values)
                _release_untrained(args, data_ref)
        else:
            ray.get(actor_model.async_train(rollout_id, data_ref))
        last = rollout_id == args.num_rollout - 1
        if args.release_train or should_run_periodic_action(rollout_id, args.save_interval, per_epoch,
                                                            args.num_rollout):
            if actor_trains:
                actor_model.save_model(rollout_id, force_sync=args.release_train or last)
            if args.use_critic:
                critic_model.save_model(rollout_id, force_sync=args.release_train or last)
            if args.rollout_global_dataset:
                ray.get(rollout_manager.save.remote(rollout_id))
        if not args.offload_train:
            (actor_model if not args.use_critic or actor_trains else critic_model).clear_memory()
        if args.offload_rollout and not args.release_train:
            ray.get(rollout_manager.onload_weights.remote())
        update_weights()
        if args.offload_rollout:
            ray.get(rollout_manager.onload_kv.remote())
        if should_run_periodic_action(rollout_id, args.eval_interval, per_epoch):
            ray.get(rollout_manager.eval.remote(rollout_id))
    ray.get(rollout_manager.dispose.remote())
    finish_tracking(args)


def main(argv: Sequence[str] | None = None) -> None:
    """slime's arguments (with its ``--custom-config-path`` YAML's ``dressage_*`` keys). The Proxy
    (:func:`~dressage.integrations.slime_config.trainer_proxy`: ``dressage_proxy_url`` or
    ``DRESSAGE_PROXY_URL``, and the admin token) is paused around weight updates, and the training
    ranks ask it for its TransferQueue; a spec file (``DRESSAGE_TQ_SPEC``, as
    ``TransferQueue.write_client_spec`` or ``dressage proxy serve --transfer-queue-spec-out`` writes
    it) overrides that."""
    import sys

    try:
        from slime.utils.arguments import parse_args  # type: ignore
    except ImportError as exc:
        raise SystemExit(f"dressage.integrations.slime_train runs slime's training: slime is not importable "
                         f"here ({exc})") from None
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    args = parse_args()
    spec_path = os.environ.get("DRESSAGE_TQ_SPEC")
    if spec_path and getattr(args, "dressage_tq_spec", None) is None:
        from dressage.tq.client.spec import load_client_spec

        # Read here: the actors get the args, not necessarily the driver's environment.
        args.dressage_tq_spec = load_client_spec(spec_path)
    url, token = trainer_proxy(args)
    control = ProxyRolloutControl(url, token=token) if url else None
    train(args, control=control)


if __name__ == "__main__":
    main()
