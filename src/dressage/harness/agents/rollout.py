"""``run_rollout``: prompts x samples agent sessions, run concurrently against the Proxy.

A session that hits a Proxy error is counted and aborted; the rollout itself always returns a
``RolloutReport``. Only bugs (and cancellation) propagate.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from dressage.errors import AgentError, ConfigError
from dressage.harness.agents.client import ProxyClient, error_kind
from dressage.harness.agents.config import AgentConfig
from dressage.harness.agents.conversation import Conversation, converse
from dressage.harness.agents.prompts import TaskPrompt, as_task_prompt

__all__ = ["SessionResult", "RolloutReport", "run_rollout", "run_session", "first_causes"]


@dataclass(slots=True)
class SessionResult:
    """What became of one agent session."""

    group_index: int
    sample_index: int
    session_id: str | None = None
    status: str = "pending"
    """``finalized``, ``aborted`` (a Proxy error after creation) or ``failed`` (never created)."""
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    retries: int = 0
    compressions: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reward: float | None = None
    end_reason: str | None = None
    """``max_turns``, ``context_limit`` or ``error``."""
    error: str | None = None
    error_kind: str | None = None


@dataclass(slots=True)
class RolloutReport:
    """Totals of a rollout and the result of every session, ordered by (group, sample)."""

    results: list[SessionResult] = field(default_factory=list)
    wall_s: float = 0.0

    def _sum(self, name: str) -> int:
        return sum(getattr(r, name) for r in self.results)

    @property
    def sessions(self) -> int:
        return len(self.results)

    @property
    def finalized(self) -> int:
        return sum(r.status == "finalized" for r in self.results)

    @property
    def turns(self) -> int:
        return self._sum("turns")

    @property
    def tool_calls(self) -> int:
        return self._sum("tool_calls")

    @property
    def retries(self) -> int:
        return self._sum("retries")

    @property
    def compressions(self) -> int:
        return self._sum("compressions")

    @property
    def errors(self) -> int:
        return sum(r.error_kind is not None for r in self.results)

    @property
    def errors_by_kind(self) -> dict[str, int]:
        return dict(Counter(r.error_kind for r in self.results if r.error_kind is not None))

    @property
    def first_errors(self) -> dict[str, str]:
        """The first error of each kind (``status_400``, ``timeout``, ...), in (group, sample) order: the
        cause a failed run names, one line per kind rather than one per session."""
        out: dict[str, str] = {}
        for r in self.results:
            if r.error_kind is not None and r.error_kind not in out:
                out[r.error_kind] = r.error or r.error_kind
        return out

    @property
    def session_ids(self) -> list[str]:
        """Ids of the sessions the Proxy created (finalized or aborted), in (group, sample) order."""
        return [r.session_id for r in self.results if r.session_id is not None]

    @property
    def finalized_session_ids(self) -> list[str]:
        return [r.session_id for r in self.results if r.status == "finalized" and r.session_id is not None]

    @property
    def sessions_per_s(self) -> float:
        return self.sessions / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "sessions": self.sessions, "finalized": self.finalized, "turns": self.turns,
            "tool_calls": self.tool_calls, "retries": self.retries, "compressions": self.compressions,
            "errors": self.errors, "errors_by_kind": self.errors_by_kind, "first_errors": self.first_errors,
            "wall_s": round(self.wall_s, 3),
            "sessions_per_s": round(self.sessions_per_s, 3), "session_ids": self.session_ids,
        }


def first_causes(first_errors: Mapping[str, str]) -> str:
    """``first cause of each kind: status_400: ...; timeout: ...`` (kinds sorted) of
    :attr:`RolloutReport.first_errors`."""
    return "first cause of each kind: " + "; ".join(f"{kind}: {first_errors[kind]}" for kind in sorted(first_errors))


def _fail(result: SessionResult, exc: AgentError, stage: str) -> None:
    result.error_kind = error_kind(exc)
    result.error = f"{stage}: {exc}"
    result.end_reason = "error"


async def _abort_quietly(client: ProxyClient, session_id: str) -> None:
    try:
        await client.abort(session_id)
    except AgentError:
        pass  # the session is already counted as failed; a second error adds nothing


async def run_session(client: ProxyClient, prompt: TaskPrompt, group_index: int, sample_index: int,
                      config: AgentConfig, metadata: Mapping[str, Any] | None = None) -> SessionResult:
    """Create, converse, finalize with the reward; on a Proxy error abort and report it."""
    result = SessionResult(group_index, sample_index)
    meta = {**(metadata or {}), "group_index": group_index, "sample_index": sample_index,
            "prompt_index": prompt.index, "task": prompt.kind}
    try:
        result.session_id, base_url = await client.create_session(meta)
    except AgentError as exc:
        _fail(result, exc, "create")
        result.status = "failed"
        return result
    conv = Conversation(prompt, config, group_index, sample_index)
    chat = client.chat_client(base_url)
    stage = "chat"
    try:
        await converse(chat, conv, config)
        stage = "finalize"
        reward = conv.reward()
        await client.finalize(result.session_id, reward)
        result.reward, result.status, result.end_reason = reward, "finalized", conv.end_reason
    except AgentError as exc:
        _fail(result, exc, stage)
        result.status = "aborted"
        await _abort_quietly(client, result.session_id)
    except asyncio.CancelledError:
        # Leave no half-recorded session behind on the Proxy, then let the cancellation through.
        await asyncio.shield(_abort_quietly(client, result.session_id))
        raise
    finally:
        for name in ("turns", "tool_calls", "tool_errors", "retries", "compressions",
                     "prompt_tokens", "completion_tokens"):
            setattr(result, name, getattr(conv, name))
    return result


def _check_args(prompts: Sequence[TaskPrompt | str], n_samples_per_prompt: int, concurrency: int,
                config: AgentConfig) -> list[TaskPrompt]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise ConfigError("prompts must be a sequence of TaskPrompt or strings")
    for key, value in (("n_samples_per_prompt", n_samples_per_prompt), ("concurrency", concurrency)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key} must be an integer >= 1, got {value!r}")
    if not isinstance(config, AgentConfig):
        raise ConfigError(f"config must be an AgentConfig, got {type(config).__name__}")
    return [as_task_prompt(p, i) for i, p in enumerate(prompts)]


async def run_rollout(proxy_url: str, prompts: Sequence[TaskPrompt | str], n_samples_per_prompt: int,
                      config: AgentConfig, *, concurrency: int, token: str | None = None,
                      metadata: Mapping[str, Any] | None = None) -> RolloutReport:
    """Run ``len(prompts) x n_samples_per_prompt`` sessions, at most ``concurrency`` at a time.

    Session (g, i) gets metadata ``group_index=g`` (the prompt's position), ``sample_index=i``,
    ``prompt_index``, ``task``, ``n_samples_per_prompt``, plus ``metadata`` (e.g. a rollout id).
    Arguments are checked before any request is sent; ``token`` is the Proxy's bearer token.
    """
    tasks = _check_args(prompts, n_samples_per_prompt, concurrency, config)
    gate = asyncio.Semaphore(concurrency)

    group_meta = {**(metadata or {}), "n_samples_per_prompt": n_samples_per_prompt}

    async def one(prompt: TaskPrompt, g: int, i: int) -> SessionResult:
        async with gate:
            return await run_session(client, prompt, g, i, config, group_meta)

    t0 = time.perf_counter()
    async with ProxyClient(proxy_url, token=token, timeout_s=config.request_timeout_s,
                           max_connections=concurrency) as client:
        jobs = [asyncio.ensure_future(one(p, g, i))
                for g, p in enumerate(tasks) for i in range(n_samples_per_prompt)]
        try:
            results = await asyncio.gather(*jobs)
        except BaseException:
            # A bug or a cancellation: stop the other sessions (each aborts itself) before the pool closes.
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            raise
    return RolloutReport(results=list(results), wall_s=time.perf_counter() - t0)
