"""The Proxy's OpenAI-compatible HTTP server (``dressage proxy serve``).

Agents use ``/sessions/{id}/v1`` as an OpenAI base URL, or ``/v1`` with session headers. Each
chat call (streamed or not) becomes engine ``/generate`` requests and, once the engine finished,
one StepRecord; errors are OpenAI-style JSON with the offending field named, and a failed call
records nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterable

import numpy as np

from dressage.errors import DressageError, EngineUnavailable, SessionStateError
from dressage.proxy.app import build_app, error_body, status_for
from dressage.proxy.chat import (ChatPrompt, QwenToolCallParser, ToolCallParser, assistant_message, build_chat_prompt,
                                 effective_tools)
from dressage.proxy.core import FinalizedSession, ProxyCore
from dressage.proxy.errors import MissingSessionIdError, SessionIdError
from dressage.proxy.generation import GenerationPlan, GenerationResult, run_generation
from dressage.proxy.limits import CallLimits
from dressage.proxy.pause import RolloutPause
from dressage.proxy.routing import EnginePool
from dressage.proxy.schemas import ChatRequest, GenerateRequest
from dressage.proxy.server_config import ProxyServerConfig
from dressage.proxy.sessions import CallIdentity, TurnCache, instance_group
from dressage.proxy.sglang_client import SGLangClient
from dressage.proxy.streaming import ChunkWriter, aiter_frames, replay_chunks, sse, stream_completion
from dressage.serving import UvicornServer
from dressage.trajectory import Boundary, RouteDecision

__all__ = ["ProxyServerConfig", "ProxyService", "ProxyServer"]


@dataclass(slots=True)
class _ChatCall:
    """A chat call validated and planned, before any engine request."""

    session_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    prompt: ChatPrompt
    plan: GenerationPlan
    engine_url: str
    completion_id: str
    created: int
    include_usage: bool
    turn_id: str | None


class ProxyService:
    """Per-process state behind the HTTP app: ProxyCore, tokenizer, engines, pause state, turns.

    ``engine`` is an :class:`SGLangClient`, a list of them, an :class:`EnginePool`, or ``None``
    (clients for ``config.engines`` are made here).
    """

    def __init__(self, config: ProxyServerConfig, core: ProxyCore, tokenizer: Any, engine: Any = None,
                 *, parser: ToolCallParser | None = None) -> None:
        self.config, self.core, self.tokenizer = config, core, tokenizer
        if isinstance(engine, EnginePool):
            self.engines = engine
        else:
            clients = engine if isinstance(engine, (list, tuple)) else [engine] if engine is not None else [
                SGLangClient(url, timeout=config.request_timeout_s) for url in config.engines]
            self.engines = EnginePool(clients, failures_to_remove=config.health_check_failures)
        self.engine = next(iter(self.engines.members.values())).client
        self.parser = parser or QwenToolCallParser()
        self.pause = RolloutPause()
        self.turns = TurnCache()
        self.finalized: dict[str, FinalizedSession] = {}
        self.calls = self.failed_calls = self.replayed_turns = 0
        self.limits = CallLimits(config)
        self._groups: dict[str, int] = {}
        self._rid_prefix = secrets.token_hex(3)
        self._rids = itertools.count()
        self._tasks: set[asyncio.Task] = set()

    @property
    def weight_version(self) -> int:
        """The policy version new tokens are recorded with."""
        return self.pause.weight_version

    @weight_version.setter
    def weight_version(self, value: int) -> None:
        self.pause.weight_version = int(value)

    def session_url(self, base: str, session_id: str) -> str:
        return f"{base.rstrip('/')}/sessions/{session_id}/v1"

    def header_session(self, ident: CallIdentity) -> str:
        """The session a header-identified call belongs to, created by its first call."""
        if not ident.session_id:
            raise MissingSessionIdError("send the session in an X-Session-Id (or X-SMG-Routing-Key) header, "
                                        "or use a session's base URL /sessions/{id}/v1")
        sid = ident.session_id
        if len(sid) > 256 or not sid.isprintable():
            raise SessionIdError("a session id is at most 256 printable characters")
        if sid not in self.core.sessions:
            meta: dict[str, Any] = {"session_source": "headers"}
            if ident.instance_id is not None:
                meta.update(instance_id=ident.instance_id, group_index=instance_group(ident.instance_id, self._groups))
            try:
                self.core.create_session(meta, session_id=sid)
            except SessionStateError:
                pass  # a concurrent first call created it
        return sid

    def _check_call(self, session_id: str) -> None:
        self.limits.check_call(self.core.active_session(session_id), self.weight_version)

    def _plan(self, session_id: str, prompt_ids: np.ndarray, decision: RouteDecision,
              sampling: dict[str, Any], *, stream: bool) -> tuple[GenerationPlan, str]:
        self.engines.ensure_monitor(self.config.health_check_interval_s)
        placement = self.engines.place(session_id)
        if placement.moved_from is not None and decision.parent_id is not None:
            # Its engine left the pool: the new one recomputes the prefix, so a new Segment starts
            # whose routing all comes from one engine.
            parent = self.core.session(session_id).step(decision.parent_id)
            decision = RouteDecision("create", None, 0, Boundary("engine_failover", matched_tokens=parent.seq_len,
                                                                 candidate_step=parent.step_id))
        placement.member.calls += 1
        rid = f"{self._rid_prefix}-{session_id}-{next(self._rids)}"
        plan = GenerationPlan(rid, prompt_ids, decision, sampling, placement.member.client,
                              self.core.generate_params(decision), stream)
        return plan, placement.member.url

    def _sampling(self, req: ChatRequest, prompt_len: int) -> dict[str, Any]:
        sp: dict[str, Any] = {"max_new_tokens": self.limits.max_new_tokens(
            req.max_completion_tokens or req.max_tokens, prompt_len),
                              "stop_token_ids": list(self.tokenizer.stop_token_ids)}
        for name in ("temperature", "top_p"):
            value = getattr(req, name)
            if value is not None:
                sp[name] = value
        if req.stop is not None:
            sp["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
        if req.seed is not None:
            sp["sampling_seed"] = req.seed
        return sp

    # -------------------------------------------------------------- chat
    def prepare_chat(self, session_id: str, req: ChatRequest, *, turn_id: str | None = None) -> _ChatCall:
        """Validate and plan a chat call (every 4xx is raised here, before any engine request)."""
        self._check_call(session_id)
        session = self.core.session(session_id)
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        tools = effective_tools(req.tools, req.tool_choice)
        prompt = build_chat_prompt(session, self.tokenizer, messages, tools)
        if prompt.boundary_reason is not None:
            decision = RouteDecision("create", None, 0, Boundary(prompt.boundary_reason))
        else:
            decision = self.core.plan(session_id, prompt.prompt_ids, tools=tools)
        sampling = self._sampling(req, len(prompt.prompt_ids))
        plan, url = self._plan(session_id, prompt.prompt_ids, decision, sampling, stream=req.stream)
        include_usage = bool(req.stream_options and req.stream_options.get("include_usage"))
        return _ChatCall(session_id, messages, tools, prompt, plan, url, f"chatcmpl-{secrets.token_hex(12)}",
                         int(time.time()), include_usage, turn_id)

    async def open_chat(self, session_id: str, req: ChatRequest, *,
                        turn_id: str | None = None) -> dict[str, Any] | AsyncIterator[bytes]:
        """A chat completion (dict) or, for ``stream``, its SSE byte stream; retried turns are replayed."""
        if turn_id is not None:
            pending = self.turns.get(session_id, turn_id)
            if pending is not None:
                try:
                    response = await asyncio.shield(pending)
                except asyncio.CancelledError:
                    if not pending.cancelled():
                        raise  # this request itself is being cancelled
                    pending = None  # the first attempt was dropped before its commit: run it anew
            if pending is not None:
                self.replayed_turns += 1
                if req.stream:
                    include = bool(req.stream_options and req.stream_options.get("include_usage"))
                    return aiter_frames(replay_chunks(response, include_usage=include))
                return response
        call = self.prepare_chat(session_id, req, turn_id=turn_id)
        if req.stream:
            return self._stream(call)  # its turn begins when the response starts (see _stream)
        if turn_id is not None:
            self.turns.begin(session_id, turn_id)
        return await self._complete(call)

    async def chat(self, session_id: str, req: ChatRequest) -> dict[str, Any]:
        """Non-streamed chat completion (kept for embedders; HTTP goes through :meth:`open_chat`)."""
        return await self._complete(self.prepare_chat(session_id, req))

    async def _generate(self, plan: GenerationPlan) -> AsyncIterator[str | GenerationResult | None]:
        self.calls += 1
        try:
            async for event in run_generation(
                    plan, self.pause, self.core.normalize, partial_rollout=self.config.partial_rollout,
                    timeout_s=self.config.request_timeout_s,
                    decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)):
                yield event
        except EngineUnavailable:
            if not self.engines.single:
                task = asyncio.get_running_loop().create_task(self.engines.check())  # out before the retry
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            raise

    def _commit_task(self, call: _ChatCall, result: GenerationResult) -> asyncio.Future:
        task = asyncio.ensure_future(self._commit(call, result))
        if call.turn_id is not None:
            self.turns.settle(call.session_id, call.turn_id, task)
        return task

    async def _final(self, plan: GenerationPlan) -> GenerationResult:
        result = None
        async for event in self._generate(plan):
            if isinstance(event, GenerationResult):
                result = event
        return result

    async def _complete(self, call: _ChatCall) -> dict[str, Any]:
        try:
            result = await self._final(call.plan)
        except BaseException as exc:
            if call.turn_id is not None:
                self.turns.abandon(call.session_id, call.turn_id, exc)
            raise
        # Shielded: an agent that hangs up now still gets its step recorded whole, or not at all.
        return await asyncio.shield(self._commit_task(call, result))

    async def _stream(self, call: _ChatCall) -> AsyncIterator[bytes]:
        if call.turn_id is not None:
            # The turn begins here, not when the call was planned: a response that never starts
            # (the agent left first) must not leave its retries waiting on a turn nobody runs.
            pending = self.turns.get(call.session_id, call.turn_id)
            if pending is not None:  # a concurrent retry of this turn started first
                self.replayed_turns += 1
                for frame in replay_chunks(await asyncio.shield(pending), include_usage=call.include_usage):
                    yield frame
                return
            self.turns.begin(call.session_id, call.turn_id)
        committing = False

        async def commit(result: GenerationResult) -> dict[str, Any]:
            nonlocal committing
            committing = True
            return await asyncio.shield(self._commit_task(call, result))

        writer = ChunkWriter(call.completion_id, self.config.served_model_name, call.created)
        try:
            async for frame in stream_completion(writer, self.parser, self._generate(call.plan), commit,
                                                 include_usage=call.include_usage):
                yield frame
        except DressageError as exc:
            if call.turn_id is not None and not committing:
                self.turns.abandon(call.session_id, call.turn_id, exc)
            self.failed_calls += 1
            _, kind = status_for(exc)
            yield sse(error_body(str(exc), kind, code=getattr(exc, "code", None) or type(exc).__name__))
        except BaseException as exc:
            if call.turn_id is not None and not committing:
                self.turns.abandon(call.session_id, call.turn_id, exc)
            raise

    async def _record(self, sid: str, plan: GenerationPlan, result: GenerationResult, engine_url: str, *,
                      metadata: dict[str, Any], **step_kwargs: Any) -> Any:
        """Commit one generated response as a StepRecord (the last check of the version rule first)."""
        self.limits.check_versions(sid, np.unique(result.token_versions).tolist())
        metadata = {**metadata, "engine": engine_url, "engine_requests": result.chunks}
        step = await asyncio.to_thread(
            self.core.record_step, sid, plan.decision, prompt_ids=plan.prompt_ids, response_ids=result.response_ids,
            logprobs=result.logprobs, routed_experts=result.routed_experts, token_versions=result.token_versions,
            metadata=metadata, **step_kwargs)
        self.limits.recorded(sid, int(result.token_versions[0]))
        self.engines.settle(sid)
        return step

    async def _commit(self, call: _ChatCall, result: GenerationResult) -> dict[str, Any]:
        sid = call.session_id
        text = self.tokenizer.decode(result.response_ids.tolist(), skip_special_tokens=True)
        message = assistant_message(self.parser, text, call_id_prefix=f"call_{call.completion_id[-10:]}")
        step = await self._record(sid, call.plan, result, call.engine_url, messages=call.messages, tools=call.tools,
                                  boundary_reason=call.prompt.boundary_reason,
                                  metadata={"assistant_message": message, "finish_reason": result.finish_reason})
        finish_reason = "tool_calls" if message.get("tool_calls") else (
            "length" if result.finish_reason == "length" else "stop")
        return {
            "id": call.completion_id, "object": "chat.completion", "created": call.created,
            "model": self.config.served_model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
            "usage": {"prompt_tokens": step.prompt_len, "completion_tokens": step.response_len,
                      "total_tokens": step.seq_len},
        }

    # ------------------------------------------------------- token level
    async def generate_tokens(self, session_id: str, req: GenerateRequest) -> dict[str, Any]:
        """Token-in, token-out call for TITO-native agents (same limits, pause and versions as chat)."""
        self._check_call(session_id)
        prompt_ids = np.asarray(req.input_ids, dtype=np.int32)
        decision = self.core.plan(session_id, prompt_ids)
        sp = dict(req.sampling_params or {})
        sp["max_new_tokens"] = self.limits.max_new_tokens(sp.get("max_new_tokens"), len(prompt_ids))
        plan, url = self._plan(session_id, prompt_ids, decision, sp, stream=False)
        result = await self._final(plan)
        step = await self._record(session_id, plan, result, url, metadata={})
        return {"output_ids": step.response_ids.tolist(),
                "text": self.tokenizer.decode(step.response_ids.tolist(), skip_special_tokens=True),
                "step_id": step.step_id, "parent_id": step.parent_id, "lineage_id": step.lineage_id,
                "meta_info": {"finish_reason": result.finish_reason, "prompt_tokens": step.prompt_len,
                              "completion_tokens": step.response_len}}

    # --------------------------------------------------------- lifecycle
    def finalize(self, session_id: str, reward: float | None) -> FinalizedSession:
        done = self.core.finalize(session_id, reward)
        self.finalized[session_id] = done
        return done

    def forget(self, session_ids: Iterable[str]) -> None:
        """Drop finished sessions once their Samples were consumed."""
        for sid in list(session_ids):
            self.finalized.pop(sid, None)
            self.core.forget(sid)
            self.engines.forget(sid)
            self.turns.forget_session(sid)
            self.limits.forget(sid)

    def stats(self) -> dict[str, Any]:
        """Counters for ``GET /trajectory/stats``."""
        states: dict[str, int] = {"active": 0, "finalized": 0, "aborted": 0}
        steps = tokens = 0
        for s in list(self.core.sessions.values()):
            states[s.state] = states.get(s.state, 0) + 1
            steps += len(s.steps)
            tokens += sum(st.response_len for st in s.steps.values())
        return {"sessions": states, "steps": steps, "response_tokens": tokens,
                "unread_trajectories": len(self.finalized),
                "unread_segments": sum(len(d.segments) for d in self.finalized.values()),
                "calls": self.calls, "failed_calls": self.failed_calls, "replayed_turns": self.replayed_turns,
                "weight_version": self.weight_version, "pause": self.pause.state(),
                "engines": self.engines.describe(), "engine_moves": len(self.engines.moves)}


class ProxyServer(UvicornServer):
    """The Proxy app under uvicorn; ``start_background()`` for tests and ``dressage run``."""

    def __init__(self, service: ProxyService) -> None:
        self.service = service
        super().__init__(build_app(service), host=service.config.host, port=service.config.port, name="proxy")
