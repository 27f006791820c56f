"""slime's rollout function (``--rollout-function-path``) for the user's own agent, one session at a time.

slime calls ``fn(args, rollout_id, data_source, evaluation=False)`` in its RolloutManager. For each of
``args.rollout_batch_size`` prompt groups from ``data_source.get_samples``, :class:`SlimeRollout` runs
the agent once per Sample of the group, each in a Proxy session of its own (``POST /sessions``, the agent
on the session's base URL, finalize with its reward), retries failed sessions, replaces failed or
filtered groups, then reads exactly this rollout's trajectories from the Proxy, restores their large
fields from the TransferQueue (``restore="rollout"``) and returns slime's ``RolloutFnTrainOutput``:
``groups[g][s]`` is the list of Segments of session ``s`` of prompt ``g``, each a copy of the data
source's Sample with the Segment's fields.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import inspect
import json
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Coroutine, Mapping, Sequence

import numpy as np

from dressage.agents import SessionContext, reward_number
from dressage.errors import ConfigError, DressageError, ProxyStatusError, TrajectoryError
from dressage.fields.versions import VersionTable
from dressage.integrations.proxy_sessions import ProxySessions, fetch_capabilities
from dressage.integrations.slime import REFS_METADATA_KEY, SlimeSample, rollout_output_classes, to_slime_sample
from dressage.integrations.slime_config import (RESTORE_MODES, check_against_proxy, check_trainer_handoff,
                                                eval_prompt_sets, load_object, rollout_settings, sampling_params)
from dressage.rollout.manager import sample_ref_keys
from dressage.train.reader import TrainingReader, release_batch
from dressage.train.remote import ProxyTrajectorySource
from dressage.trajectory import SAMPLE_LARGE_FIELDS

__all__ = ["SlimeRollout", "install", "generate_rollout"]

log = logging.getLogger(__name__)


class _SessionFailed(Exception):
    """A session failed on every try (the agent raised, timed out, or returned a non-finite reward)."""


class _GroupLost(Exception):
    """A group is discarded and replaced: a session failed on every try, or the dynamic filter dropped it."""

    def __init__(self, why: str, *, filtered: bool) -> None:
        super().__init__(why)
        self.filtered = filtered


@dataclass(slots=True)
class _Finished:
    """A finalized session: the data source's Sample it ran and the agent's reward."""

    session_id: str
    source: Any
    reward: Any
    rollout_id: int


def _run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to completion from synchronous code, also when this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _keeps(output: Any) -> bool:
    """slime's ``DynamicFilterOutput.keep``, or a plain bool: any one-value truth (slime's own
    ``check_reward_nonzero_std`` gives a 0-d torch bool tensor; slime tests it with ``if output.keep``).
    (``keep_when_insufficient`` does not apply: a dropped group is always replaced, within the rollout's
    replacement budget.)"""
    keep = getattr(output, "keep", output)
    if isinstance(keep, (bool, np.bool_)):
        return bool(keep)
    if getattr(keep, "dtype", None) is None or getattr(keep, "ndim", None) != 0:  # not a 0-d array or tensor
        raise ConfigError(f"dynamic_sampling_filter_path: the filter returned {output!r}, expected a bool (or a "
                          "one-value bool tensor or array) or an object with .keep")
    return bool(keep)


class SlimeRollout:
    """Callable as slime's rollout function; runs ``agent`` once per Sample, each in its own Proxy session.

    ``agent`` is ``async (ctx: SessionContext) -> reward`` (see :mod:`dressage.agents`). ``agent_config``
    is the other way to name it: any object whose ``session_agent()`` returns such an agent (the
    simulated agents' ``AgentConfig`` does), so that this layer needs no import of what provides it.
    ``concurrency`` bounds the sessions in flight; a session whose agent raises, outlives ``timeout_s``
    or returns a non-finite reward is discarded and run again in a fresh session up to
    ``session_retries`` times; a group that still fails is discarded and replaced by a group from the
    data source, at most ``max_group_replacements`` times a rollout (default: 2 x rollout_batch_size).
    ``token`` is the agents' bearer token, ``admin_token`` the trainer's (discard, trajectory read).
    ``restore``: ``rollout`` restores the large fields here and releases their TQ keys; ``trainer``
    leaves their FieldRefs in the Samples, and is refused unless slime's ``args`` say Dressage's conversion
    and training entry take them (:func:`~dressage.integrations.slime_config.check_trainer_handoff`).
    ``model`` is the model name agents send (``ctx.model``).
    """

    def __init__(self, *, proxy_url: str, agent: Any = None, agent_config: Any = None, concurrency: int = 64,
                 session_retries: int = 1, timeout_s: float = 3600.0, token: str | None = None,
                 admin_token: str | None = None, versions: VersionTable | None = None, restore: str = "rollout",
                 max_group_replacements: int | None = None, model: str | None = None) -> None:
        if (agent is None) == (agent_config is None):
            raise ConfigError("give exactly one of agent (an async callable ctx -> reward) and agent_config")
        if agent_config is not None:
            make = getattr(agent_config, "session_agent", None)
            if not callable(make):
                raise ConfigError(f"agent_config must have a session_agent() method, got {type(agent_config).__name__}")
            agent = make()
        if not callable(agent):
            raise ConfigError(f"agent must be an async callable ctx -> reward, got {agent!r}")
        for key, value, low in (("concurrency", concurrency, 1), ("session_retries", session_retries, 0),
                                ("max_group_replacements", max_group_replacements, 0)):
            if value is None and key == "max_group_replacements":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{key} must be an integer >= {low}, got {value!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ConfigError(f"timeout_s must be a number > 0, got {timeout_s!r}")
        if restore not in RESTORE_MODES:
            raise ConfigError(f"restore must be one of {', '.join(RESTORE_MODES)}, got {restore!r}")
        self.proxy_url = proxy_url.rstrip("/") if isinstance(proxy_url, str) else proxy_url
        self.agent, self.concurrency, self.session_retries = agent, concurrency, session_retries
        self.timeout_s, self.token, self.admin_token = float(timeout_s), token, admin_token
        self.versions, self.restore, self.max_group_replacements = versions, restore, max_group_replacements
        self.model = model or "default"
        self._source = ProxyTrajectorySource(proxy_url, token=admin_token or token)
        self.last_metrics: dict[str, Any] = {}

    @classmethod
    def from_args(cls, args: Any) -> "SlimeRollout":
        """The rollout slime's ``args`` describe (the ``dressage_*`` keys of ``--custom-config-path``),
        after asking the Proxy what it records: one :class:`ConfigError` names a flag it cannot honour."""
        settings = rollout_settings(args)
        caps = fetch_capabilities(settings["proxy_url"], token=settings["token"] or settings["admin_token"])
        check_against_proxy(args, caps)
        model = (caps.get("model") or {}).get("served_model_name") or getattr(args, "hf_checkpoint", None)
        return cls(**settings, model=model)

    # ------------------------------------------------------------------ slime's entry
    def __call__(self, args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
        if self.restore == "trainer" and not evaluation:
            check_trainer_handoff(args)  # also for a rollout installed by hand: the args say who trains
        train_cls, eval_cls = rollout_output_classes()
        if evaluation:
            data, metrics = _run_sync(self._evaluate(args, int(rollout_id)))
            return eval_cls(data=data, metrics=metrics)
        n_groups = getattr(args, "rollout_batch_size", None)
        if isinstance(n_groups, bool) or not isinstance(n_groups, int) or n_groups < 1:
            raise ConfigError(f"args.rollout_batch_size must be a positive integer, got {n_groups!r}")
        reward_key = getattr(args, "reward_key", None)
        filter_path = getattr(args, "dynamic_sampling_filter_path", None)
        dynamic_filter = None if filter_path is None else load_object(filter_path, "dynamic_sampling_filter_path")
        limit = 2 * n_groups if self.max_group_replacements is None else self.max_group_replacements
        groups = self._draw(data_source, n_groups)
        stats: Counter[str] = Counter()
        finished = _run_sync(self._rollout(args, int(rollout_id), data_source, groups, reward_key,
                                           dynamic_filter, limit, stats))
        out, restored_bytes = self._collect(finished)
        counts = [len(sess) for grp in out for sess in grp]
        metrics = {"dressage/groups_replaced": stats["groups_replaced"],
                   "dressage/groups_filtered": stats["groups_filtered"],
                   "dressage/sessions_failed": stats["sessions_failed"],
                   "dressage/segments_per_session_mean": float(np.mean(counts)) if counts else 0.0,
                   "dressage/segments_per_session_max": max(counts, default=0),
                   "dressage/tq_bytes_restored": restored_bytes}
        self.last_metrics = metrics
        return train_cls(samples=out, metrics=metrics)

    @staticmethod
    def _draw(data_source: Any, n: int) -> list[list[Any]]:
        groups = data_source.get_samples(n)
        if not isinstance(groups, list) or len(groups) != n or any(not isinstance(g, list) or not g for g in groups):
            raise ConfigError(f"data_source.get_samples({n}) must return {n} non-empty lists of Samples")
        return groups

    # ------------------------------------------------------------------ sessions
    def _context(self, sid: str, src: Any, group_index: int, rollout_id: int, sampling: dict[str, Any],
                 evaluation: bool) -> SessionContext:
        return SessionContext(
            session_id=sid, base_url=f"{self.proxy_url}/sessions/{sid}/v1",
            anthropic_base_url=f"{self.proxy_url}/sessions/{sid}", api_key=self.token or "none",
            headers={"X-Session-Id": sid, "X-Instance-Id": str(group_index)}, model=self.model,
            prompt=getattr(src, "prompt", None), label=getattr(src, "label", None),
            metadata=copy.deepcopy(dict(getattr(src, "metadata", None) or {})), group_index=group_index,
            index=getattr(src, "index", None), rollout_id=rollout_id, evaluation=evaluation,
            sampling_params=dict(sampling))

    async def _session(self, proxy: ProxySessions, gate: asyncio.Semaphore, created: list[str], stats: Counter,
                       src: Any, group_index: int, sample_pos: int, rollout_id: int, sampling: dict[str, Any],
                       reward_key: str | None, evaluation: bool) -> _Finished:
        """One Sample's session, tried ``1 + session_retries`` times; finalized (or, evaluating, discarded).
        ``sampling``: slime's sampling settings the agent is given (the rollout's, or an eval dataset's)."""
        index = getattr(src, "index", None)
        meta = {"group_index": group_index, "instance_id": str(group_index), "sample_index": sample_pos,
                "index": None if index is None else int(index), "rollout_id": rollout_id,
                "label": _json_safe(getattr(src, "label", None))}
        last: BaseException | None = None
        for _ in range(1 + self.session_retries):
            async with gate:
                sid = await self._create(proxy, meta, created)
                ctx = self._context(sid, src, group_index, rollout_id, sampling, evaluation)
                try:
                    run = self.agent(ctx)
                    if not inspect.isawaitable(run):  # every session would fail the same way: say so once
                        raise ConfigError(f"dressage_agent: the agent must be an async function (a coroutine "
                                          f"function); it returned {type(run).__name__} instead of an awaitable")
                    reward = await asyncio.wait_for(run, self.timeout_s)
                    value = reward_number(reward, reward_key)
                except ConfigError:
                    raise  # a reward mapping without --reward-key: every session would fail the same way
                except Exception as exc:  # the user's agent: whatever it raises fails this session only
                    last = exc
                    stats["sessions_failed"] += 1
                    await proxy.discard(sid)
                    continue
                if evaluation:
                    await proxy.discard(sid)  # evaluated, never trained on: its keys go now
                else:
                    try:
                        await proxy.finalize(sid, value)
                    except ProxyStatusError as exc:
                        if exc.status_code != 409 or "no steps" not in str(exc):
                            raise
                        # The agent returned without one model call: nothing to train on, a failed session.
                        last = TrajectoryError(f"the agent returned without calling the Proxy at {ctx.base_url} "
                                               "(a session with no model call has nothing to train on)")
                        stats["sessions_failed"] += 1
                        await proxy.discard(sid)
                        continue
                # slime's rollout id is the data source's index; without one, an id of this session's own
                # (its place among the rollout's sessions: sessions that finish together differ all the same)
                return _Finished(sid, src, reward, int(index) if index is not None else -1 - created.index(sid))
        raise _SessionFailed(f"Sample {index} of group {group_index} failed {1 + self.session_retries} times; "
                             f"last: {type(last).__name__}: {last}") from last

    async def _group(self, proxy: ProxySessions, gate: asyncio.Semaphore, created: list[str], stats: Counter,
                     group: Sequence[Any], slot: int, rollout_id: int, args: Any, reward_key: str | None,
                     dynamic_filter: Any) -> list[_Finished]:
        """Every session of one prompt group; :class:`_GroupLost` (its sessions discarded) when it cannot be used."""
        group_index = getattr(group[0], "group_index", None)
        group_index = slot if group_index is None else int(group_index)
        sampling = sampling_params(args)
        jobs = [asyncio.ensure_future(self._session(proxy, gate, created, stats, src, group_index, i, rollout_id,
                                                    sampling, reward_key, False)) for i, src in enumerate(group)]
        results = await asyncio.gather(*jobs, return_exceptions=True)  # cancelling this cancels the sessions
        done = [r for r in results if isinstance(r, _Finished)]
        errors = [r for r in results if not isinstance(r, _Finished)]
        for err in errors:
            if not isinstance(err, _SessionFailed):
                raise err  # the Proxy failed or a bug: the rollout discards everything it made
        if errors:
            await self._discard_all(proxy, [d.session_id for d in done])
            raise _GroupLost(str(errors[0]), filtered=False) from errors[0]
        if dynamic_filter is not None:
            view = []
            for d in done:
                s = copy.deepcopy(d.source)
                s.reward = d.reward
                view.append(s)
            if not _keeps(dynamic_filter(args, view)):
                await self._discard_all(proxy, [d.session_id for d in done])
                raise _GroupLost(f"group {group_index} dropped by the dynamic sampling filter", filtered=True)
        return done

    def _sessions(self) -> ProxySessions:
        return ProxySessions(self.proxy_url, token=self.token, admin_token=self.admin_token,
                             timeout_s=min(self.timeout_s, 600.0), max_connections=self.concurrency)

    @staticmethod
    async def _create(proxy: ProxySessions, meta: Mapping[str, Any], created: list[str]) -> str:
        """``POST /sessions``, the new id noted in ``created`` even when the rollout is cancelled meanwhile
        (the Proxy made the session all the same, and the rollout's clean-up must discard it)."""
        job = asyncio.ensure_future(proxy.create(meta))
        try:
            sid = await asyncio.shield(job)
        except asyncio.CancelledError:
            try:
                created.append(await job)
            except Exception:
                pass  # the create itself failed: there is no session to discard
            raise
        created.append(sid)
        return sid

    @staticmethod
    async def _discard_all(proxy: ProxySessions, session_ids: Sequence[str]) -> None:
        for sid in session_ids:
            try:
                await proxy.discard(sid)
            except ProxyStatusError as exc:
                if exc.status_code != 404:  # already gone is what discarding wants
                    raise

    async def _rollout(self, args: Any, rollout_id: int, data_source: Any, groups: list[list[Any]],
                       reward_key: str | None, dynamic_filter: Any, limit: int,
                       stats: Counter) -> list[list[_Finished]]:
        created: list[str] = []
        gate = asyncio.Semaphore(self.concurrency)
        out: list[list[_Finished] | None] = [None] * len(groups)
        async with self._sessions() as proxy:
            def start(slot: int, group: list[Any]) -> asyncio.Future:
                return asyncio.ensure_future(self._group(proxy, gate, created, stats, group, slot, rollout_id, args,
                                                         reward_key, dynamic_filter))

            pending = {start(slot, g): slot for slot, g in enumerate(groups)}
            try:
                while pending:
                    done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for job in done:
                        slot = pending.pop(job)
                        exc = job.exception()
                        if exc is None:
                            out[slot] = job.result()
                            continue
                        if not isinstance(exc, _GroupLost):
                            raise exc
                        stats["groups_filtered" if exc.filtered else "groups_failed"] += 1
                        if stats["groups_replaced"] >= limit:
                            raise TrajectoryError(
                                f"rollout {rollout_id}: {stats['groups_failed']} groups failed and "
                                f"{stats['groups_filtered']} were filtered, more than the {limit} replacements "
                                f"allowed (last: {exc})") from exc
                        stats["groups_replaced"] += 1
                        pending[start(slot, self._draw(data_source, 1)[0])] = slot
            except BaseException:
                for job in pending:
                    job.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                await asyncio.shield(self._discard_all(proxy, list(dict.fromkeys(created))))
                raise
        return [g for g in out if g is not None]

    # ------------------------------------------------------------------ read, restore, shape
    def _collect(self, finished: list[list[_Finished]]) -> tuple[list[list[list[Any]]], int]:
        """Read exactly these sessions' Samples from the Proxy, restore them (``restore="rollout"``) and
        shape them as ``groups[g][s] = [Segment, ...]``; returns the groups and the TQ bytes restored.

        A read, restore, shape or ack that fails discards the sessions, their TQ keys with them: nothing
        else reads them (each rollout reads only the sessions it made, by name), so handed back to the
        Proxy they would wait there, and their keys in TQ, for a read that never comes."""
        session_ids = [f.session_id for g in finished for f in g]
        batch = None
        try:
            batch = self._source.read(session_ids=session_ids, lease=True)
            groups, restored, consumed = self._shape(finished, session_ids, batch)
            acknowledged = self._acknowledge(batch, session_ids)
        except BaseException:
            _run_sync(self._abandon(session_ids))
            if batch is not None:
                try:  # the read's lease, empty now, ends too
                    self._source.release(batch)
                except DressageError:
                    pass  # it runs out on its own
            raise
        # Restored into the Samples and acknowledged: nothing of this rollout stays in TQ. A session another
        # named read took over meanwhile is that reader's, and so are its keys.
        consumed = sorted(set(consumed) & acknowledged)
        if consumed:
            release_batch(self._source.client(), consumed)
        return groups, restored

    def _acknowledge(self, batch: Any, session_ids: list[str]) -> set[str]:
        """Acknowledge the read; the TQ keys of the sessions the ack covered. When its lease ended before the
        ack (a restore that outlived it: 409; a Proxy that restarted and lost it: 404), the trajectories are
        still on the Proxy and the Samples in hand are theirs (a finalized trajectory does not change): lease
        them again by name and ack that."""
        try:
            self._source.ack(batch)
        except ProxyStatusError as exc:
            if exc.status_code not in (404, 409):
                raise
            batch = self._source.read(session_ids=session_ids, lease=True)
            self._source.ack(batch)
        return set(batch.acknowledged_keys())

    async def _abandon(self, session_ids: Sequence[str]) -> None:
        """Discard a failed collect's sessions; a Proxy that cannot be reached leaves them to its own
        clean-up (the error that failed the collect is the one raised)."""
        try:
            async with self._sessions() as proxy:
                await self._discard_all(proxy, session_ids)
        except DressageError as exc:
            log.warning("could not discard the %d sessions of a failed rollout read: %s", len(session_ids), exc)

    def _shape(self, finished: list[list[_Finished]], session_ids: list[str],
               batch: Any) -> tuple[list[list[list[Any]]], int, list[str]]:
        """The groups, the TQ bytes restored, and the keys restored here (the caller releases them once
        the read is acknowledged)."""
        keys = sample_ref_keys(batch.samples)
        samples, restored = batch.samples, 0
        if keys and self.restore == "rollout":
            client = self._source.client()
            remote = [(s, list(s.remote)) for s in samples]
            samples = TrainingReader(client).restore(samples)
            restored = sum(int(getattr(s, SAMPLE_LARGE_FIELDS[n]).nbytes) for s, names in remote for n in names)
        by_session: dict[str, list[Any]] = {}
        for s in samples:
            by_session.setdefault(s.session_id, []).append(s)
        missing = [sid for sid in session_ids if sid not in by_session]
        if missing:
            raise TrajectoryError(f"{self.proxy_url}: the read returned no Samples for sessions {missing[:5]}")
        keep_refs = self.restore == "trainer"
        groups = [[[self._segment(f, seg, len(by_session[f.session_id]), keep_refs)
                    for seg in sorted(by_session[f.session_id], key=lambda s: s.segment_index)]
                   for f in g] for g in finished]
        return groups, restored, (sorted(keys) if self.restore == "rollout" else [])

    def _segment(self, f: _Finished, seg: Any, count: int, keep_refs: bool) -> Any:
        """One Segment as a copy of the data source's Sample with the Segment's fields."""
        shaped = to_slime_sample(seg, rollout_id=f.rollout_id, versions=self.versions, cls=SlimeSample,
                                 keep_refs=keep_refs)
        out = copy.deepcopy(f.source)
        for name in ("tokens", "response_length", "loss_mask", "rollout_log_probs", "rollout_routed_experts",
                     "weight_versions"):
            setattr(out, name, getattr(shaped, name))
        status_cls = getattr(type(out), "Status", None)
        out.status = shaped.status if status_cls is None else status_cls[shaped.status.name]
        out.rollout_id = f.rollout_id
        out.reward = copy.deepcopy(f.reward)
        out.metadata = {**(getattr(f.source, "metadata", None) or {}), "session_id": f.session_id,
                        "segment_index": int(seg.segment_index), "segment_count": count}
        if REFS_METADATA_KEY in shaped.metadata:  # the fields left in TQ: the training rank restores them
            out.metadata[REFS_METADATA_KEY] = shaped.metadata[REFS_METADATA_KEY]
        return out

    def close(self) -> None:
        """Leave the TransferQueue the Proxy named (joined on the first restore)."""
        self._source.close()

    # ------------------------------------------------------------------ evaluation
    async def _evaluate(self, args: Any, rollout_id: int) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
        """slime's eval output over ``args.eval_datasets``: each session is discarded after its reward."""
        from dressage.integrations.slime import slime_sample_class

        cls = slime_sample_class()
        reward_key = getattr(args, "eval_reward_key", None) or getattr(args, "reward_key", None)
        sets = eval_prompt_sets(args, cls)
        stats: Counter[str] = Counter()
        created: list[str] = []
        gate = asyncio.Semaphore(self.concurrency)
        data: dict[str, dict[str, Any]] = {}
        async with self._sessions() as proxy:
            for name, samples, sampling in sets:
                jobs = [asyncio.ensure_future(self._session(proxy, gate, created, stats, s, int(s.group_index), 0,
                                                            rollout_id, sampling, reward_key, True)) for s in samples]
                try:
                    finished = await asyncio.gather(*jobs)
                except BaseException as exc:
                    for job in jobs:
                        job.cancel()
                    await asyncio.gather(*jobs, return_exceptions=True)
                    await asyncio.shield(self._discard_all(proxy, list(dict.fromkeys(created))))
                    if isinstance(exc, _SessionFailed):
                        raise TrajectoryError(f"eval dataset {name}: {exc}") from exc
                    raise
                out = []
                for f in finished:
                    s = copy.deepcopy(f.source)
                    s.reward, s.status = f.reward, cls.Status.COMPLETED
                    s.metadata = {**(s.metadata or {}), "session_id": f.session_id}
                    out.append(s)
                data[name] = {"rewards": [reward_number(s.reward, reward_key) if isinstance(s.reward, Mapping)
                                          else s.reward for s in out],
                              "truncated": [s.status == cls.Status.TRUNCATED for s in out], "samples": out}
        return data, {"dressage/eval_sessions_failed": stats["sessions_failed"]}


_installed: SlimeRollout | None = None


def install(rollout: SlimeRollout | None) -> None:
    """Make ``rollout`` the one :func:`generate_rollout` runs (``None`` uninstalls)."""
    global _installed
    _installed = rollout


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout-function entry point (``--rollout-function-path``).

    Runs the installed :class:`SlimeRollout`; with none installed, builds one from ``args``
    (:meth:`SlimeRollout.from_args`) on the first call and keeps it for the next ones.
    """
    global _installed
    if _installed is None:
        _installed = SlimeRollout.from_args(args)
    return _installed(args, rollout_id, data_source, evaluation=evaluation)
