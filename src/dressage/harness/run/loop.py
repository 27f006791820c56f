"""The rollout -> train loop of ``dressage run``.

Each iteration: agents (official openai client) drive sessions through the Proxy's HTTP server ->
finalize -> RolloutManager -> DP shards -> training readers restore the large fields -> the
consumer checks every Sample -> the batch's TQ keys are cleared.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from dressage.engine.config import EngineConfig
from dressage.engine.server import EngineServer
from dressage.errors import AgentError, ConfigError, DressageError
from dressage.harness.agents import AgentConfig, make_prompts, run_rollout
from dressage.harness.agents.rollout import first_causes
from dressage.harness.replay import merge_replay, replay_summary
from dressage.harness.run.config import RunConfig
from dressage.harness.run.memory import PssSampler, process_vitals
from dressage.harness.run.probe import check_engine_reachable
from dressage.proxy.config import EnginesConfig, ProxyConfig
from dressage.proxy.deployment import Proxy
from dressage.proxy.parsers import ParseEndpoints
from dressage.rollout import RolloutManager
from dressage.rollout.manager import sample_ref_keys, sample_resident_nbytes
from dressage.train import TrainingReader, releasing
from dressage.train.reader import count_keys_left
from dressage.train.digest import combine_digests
from dressage.train.summary import summarise_shard

__all__ = ["RunReport", "run_pipeline"]


@dataclass(slots=True)
class RunReport:
    config: dict[str, Any]
    sessions: int = 0
    segments: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    steps: int = 0
    agent: dict[str, int] = field(default_factory=dict)
    first_errors: dict[str, str] = field(default_factory=dict)
    """The first failure of each kind of agent session failure (``status_400``: ...), over every rollout."""
    large_field_bytes: dict[str, int] = field(default_factory=dict)
    """Bytes of logprobs / routed experts restored for training (int32 R3, float32 logprobs)."""
    stored_large_field_bytes: int = 0
    """Bytes the large fields took where they were kept (Proxy, or StorageUnits with TQ)."""
    rollout_manager_path_bytes: int = 0
    """Bytes of Samples that passed through the RolloutManager (resident arrays only)."""
    tq_bytes_written: int = 0
    tq_bytes_read: int = 0
    tq_keys_left: int | None = 0
    """Keys the StorageUnits hold after the last batch was consumed; None when a unit could not be asked."""
    tq_keys_uncounted: str = ""
    """Why ``tq_keys_left`` is None: the unit that did not answer the count (the verdict fails on it)."""
    peak_memory_bytes: dict[str, int] = field(default_factory=dict)
    samples_digest: str = ""
    replay: dict[str, Any] = field(default_factory=dict)
    """With ``--engine transformers`` and R3: the trainer's forced-routing forward pass against the
    recorded logprobs (:func:`dressage.harness.replay.replay_summary`, summed over every Sample)."""
    rollouts: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    session_views: list[dict[str, Any]] = field(default_factory=list)
    """The last rollout's sessions as session documents (the viewer's data; not in :meth:`to_dict`)."""

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__ if name != "session_views"}


def _peak(report: RunReport, name: str, value: int) -> None:
    report.peak_memory_bytes[name] = max(report.peak_memory_bytes.get(name, 0), int(value))


def _agent_config(cfg: RunConfig) -> AgentConfig:
    agents = cfg.agents
    return AgentConfig(max_turns=agents.max_turns, tools=cfg.inference.tool_call_rate > 0, retry_rate=agents.retry_rate,
                       context_length=agents.context_length, max_tokens=agents.max_tokens, seed=cfg.seed)


def run_pipeline(cfg: RunConfig) -> RunReport:
    """Run ``cfg.rollout.num_rollouts`` iterations on the embedded default (or Ray, with ``cfg.cluster.ray``)."""
    dp = cfg.data_plane
    shape = cfg.rollout
    report = RunReport(config={**dp.to_dict(), "num_rollouts": shape.num_rollouts,
                               "rollout_batch_size": shape.rollout_batch_size,
                               "n_samples_per_prompt": shape.n_samples_per_prompt,
                               "context_length": cfg.agents.context_length, "dp_size": shape.dp_size,
                               "seed": cfg.seed, "ray": cfg.cluster.ray, "engine": cfg.inference.backend,
                               "engine_url": cfg.inference.engine_url})
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        sampler = stack.enter_context(PssSampler(interval_s=0.2))
        engine_url = cfg.inference.engine_url
        engine: EngineServer | None = None
        tokenizer = None
        if engine_url is None:
            inference = cfg.inference
            engine = EngineServer(EngineConfig(model=dp.model, port=0, seed=cfg.seed, backend=inference.backend,
                                               tokenizer=_TOKENIZER[inference.backend],
                                               mean_response_tokens=inference.mean_response_tokens,
                                               tool_call_rate=inference.tool_call_rate,
                                               context_length=cfg.agents.context_length),
                                  reply_parsers=ParseEndpoints())
            tokenizer = engine.engine.tokenizer
            engine_url = engine.start_background()
            stack.callback(engine.stop)
        else:
            check_engine_reachable(engine_url)
        if cfg.cluster.ray:
            # Ray is joined once, at the run's address, before a TransferQueue on Ray or the actors need it.
            import ray

            from dressage.train.ray_actors import join_ray

            if join_ray(cfg.cluster.ray_address):
                stack.callback(ray.shutdown)
        tq = None
        if dp.enable_transfer_queue:
            from dressage.tq import TransferQueue

            tq = TransferQueue.start(cfg.transfer_queue.settings())
            stack.callback(tq.shutdown)
        client = tq.client() if tq is not None else None
        replay_model = _replay_model(cfg, engine) if engine is not None and cfg.inference.backend == "transformers" \
            and dp.use_rollout_routing_replay else None
        backend = _RayBackend(cfg, tq, client) if cfg.cluster.ray else _LocalBackend(cfg, client, replay_model)
        stack.callback(backend.close)
        rollout_tag = {"id": 0}
        proxy = stack.enter_context(Proxy.start(
            ProxyConfig(data_plane=dp, engines=EnginesConfig(engine_url=engine_url),
                        tokenizer=_TOKENIZER[cfg.inference.backend]),
            tq_client=client, tokenizer=tokenizer,
            sink=backend.sink, batch_tag=lambda: f"rollout-{rollout_tag['id']}"))
        core, service, proxy_url = proxy.core, proxy.service, proxy.url
        agent_cfg = _agent_config(cfg)
        digests: list[str] = []
        bar = _progress(cfg)
        for i in range(cfg.rollout.num_rollouts):
            rollout_tag["id"] = i
            service.weight_version = i
            prompts = make_prompts(cfg.rollout.rollout_batch_size, seed=cfg.seed * 1000 + i)
            rr = asyncio.run(run_rollout(proxy_url, prompts, cfg.rollout.n_samples_per_prompt, agent_cfg,
                                         concurrency=cfg.rollout.concurrency))
            for k, v in _agent_counts(rr).items():
                report.agent[k] = report.agent.get(k, 0) + v
            for kind, message in rr.first_errors.items():
                report.first_errors.setdefault(kind, f"rollout {i}: {message}")
            if rr.sessions and not rr.finalized:
                raise AgentError(f"rollout {i} produced no Samples: all {rr.sessions} agent sessions failed; "
                                 + first_causes(rr.first_errors))
            _peak(report, "proxy_large_fields", core.held_bytes()["large_fields"])
            _peak(report, "rollout_manager", backend.held_nbytes())
            if tq is not None:
                _peak(report, "tq_storage_units", sum(u.get("bytes", 0) for u in tq.stats().values()))
            report.stored_large_field_bytes += sum(
                st.large_field_nbytes().get(n, 0) for s in core.sessions.values() for st in s.steps.values()
                for n in ("logprobs", "routed_experts"))
            report.steps += sum(len(s.steps) for s in core.sessions.values())
            out = backend.train(i)
            digests.append(out["digest"])
            for name in ("segments", "tokens", "trained_tokens", "rollout_manager_path_bytes"):
                setattr(report, name, getattr(report, name) + out[name])
            for name, n in out["large_field_bytes"].items():
                report.large_field_bytes[name] = report.large_field_bytes.get(name, 0) + n
            if "replay" in out:
                report.replay = merge_replay(report.replay, out["replay"])
            finished = [sid for sid, s in core.sessions.items() if s.state != "active"]
            report.sessions += len(finished)
            if cfg.report.html:  # only the last rollout's: the page stays the size of one batch
                report.session_views = [_session_view(core, service, sid) for sid in finished]
            service.trajectories.forget(finished)
            keys_left, _ = count_keys_left(tq)
            report.rollouts.append({"rollout": i, "sessions": len(finished), "segments": out["segments"],
                                    "digest": out["digest"], "tq_keys_left": keys_left,
                                    "agent_errors": _agent_counts(rr).get("errors", 0),
                                    "proxy_sessions_held": len(core.sessions), **process_vitals()})
            if bar is not None:
                bar.update(1)
                bar.set_postfix(segments=report.segments, keys_left=keys_left)
        if bar is not None:
            bar.close()
        if client is not None:
            report.tq_bytes_written = client.counters.bytes_written
            report.tq_bytes_read = client.counters.bytes_read + backend.remote_bytes_read
            report.tq_keys_left, report.tq_keys_uncounted = count_keys_left(tq)
        report.samples_digest = combine_digests((i, bytes.fromhex(d)) for i, d in enumerate(digests))
        _peak(report, "process_pss", sampler.peak)
    report.wall_s = time.perf_counter() - t0
    return report


def _session_view(core: Any, service: Any, session_id: str) -> dict[str, Any]:
    from dressage.trajectory.view import session_document

    done = service.trajectories.finalized.get(session_id)
    return session_document(core.session(session_id), None if done is None else done.segments,
                            reward=None if done is None else done.reward)


# The tokenizer the started engine and the Proxy share.
_TOKENIZER = {"builtin": "byte", "transformers": "qwen3"}


def _replay_model(cfg: RunConfig, engine: EngineServer) -> Any:
    """The trainer's own copy of the engine's model: same config and seed, built separately."""
    from dressage.engine.moe import build_moe_model

    return build_moe_model(cfg.data_plane.model.name, vocab_size=engine.engine.moe.vocab_size, seed=cfg.seed)


def _agent_counts(rr: Any) -> dict[str, int]:
    names = ("sessions", "turns", "tool_calls", "retries", "compressions", "errors")
    return {n: int(getattr(rr, n, 0) or 0) for n in names if isinstance(getattr(rr, n, 0), (int, float))}


def _progress(cfg: RunConfig):
    if not cfg.report.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.rollout.num_rollouts, desc="dressage run", unit="rollout")


def _merge(parts: list[dict[str, Any]], rm_bytes: int) -> dict[str, Any]:
    merged = {"segments": 0, "tokens": 0, "trained_tokens": 0, "large_field_bytes": {},
              "rollout_manager_path_bytes": rm_bytes}
    keyed = []
    for p in parts:
        for k in ("segments", "tokens", "trained_tokens"):
            merged[k] += p[k]
        for name, n in p["large_field_bytes"].items():
            merged["large_field_bytes"][name] = merged["large_field_bytes"].get(name, 0) + n
        keyed += p["digests"]
    merged["digest"] = combine_digests(keyed)
    return merged


class _LocalBackend:
    """RolloutManager and DP readers in this process."""

    remote_bytes_read = 0

    def __init__(self, cfg: RunConfig, client: Any, replay_model: Any = None) -> None:
        self.cfg, self.client, self.replay_model = cfg, client, replay_model
        self.rm = RolloutManager(dp_size=cfg.rollout.dp_size)
        self.sink = self.rm.add_finalized

    def held_nbytes(self) -> int:
        return self.rm.held_nbytes()

    def train(self, rollout_id: int) -> dict[str, Any]:
        batch = self.rm.take_batch(rollout_id)
        if not batch.samples:
            raise DressageError(f"rollout {rollout_id} produced no Samples (every agent session failed?)")
        keys = sample_ref_keys(batch.samples)
        rm_bytes = sum(sample_resident_nbytes(s) for s in batch.samples)
        parts, replay = [], {}
        with releasing(self.client, sorted(keys)):  # also when a rank failed: the batch left the RolloutManager
            for shard in batch.shards:
                TrainingReader(self.client).restore(shard)
                parts.append(summarise_shard(shard, self.cfg.data_plane.model))
                if self.replay_model is not None:
                    replay = merge_replay(replay, replay_summary(self.replay_model, shard))
        merged = _merge(parts, rm_bytes)
        if self.replay_model is not None:
            merged["replay"] = replay
        return merged

    def close(self) -> None:
        pass


class _RayBackend:
    """RolloutManager and one trainer reader per DP rank as Ray actors; Samples travel via ``ray.put``."""

    def __init__(self, cfg: RunConfig, tq: Any, client: Any) -> None:
        from dressage.train.ray_actors import RayBackendConfig, start_ray_backend

        if tq is not None and tq.deployment == "embedded":
            raise ConfigError("--ray with TransferQueue needs a 'local' or 'ray' deployment in "
                              "--transfer-queue-config (trainer actors must reach the StorageUnits)")
        self.cfg = cfg
        ray_cfg = RayBackendConfig(model=cfg.data_plane.model, dp_size=cfg.rollout.dp_size,
                                  ray_address=cfg.cluster.ray_address)
        self.impl = start_ray_backend(ray_cfg, tq.client_spec() if tq is not None else None, client)
        self.sink = self.impl.sink
        self.remote_bytes_read = 0

    def held_nbytes(self) -> int:
        return self.impl.held_nbytes()

    def train(self, rollout_id: int) -> dict[str, Any]:
        parts, rm_bytes, bytes_read = self.impl.train(rollout_id)
        self.remote_bytes_read += bytes_read
        return _merge(parts, rm_bytes)

    def close(self) -> None:
        self.impl.close()
