"""One model call's path through the Proxy service: validate, place, decide, generate, commit.

:class:`CallPath` holds the chat (streamed or not) and token-level use cases of
:class:`dressage.proxy.service.ProxyService`; each ends in one ``ProxyCore.record_step``. Every
4xx is raised in ``prepare_chat`` / before the engine request, and a failed call records nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import numpy as np

from dressage.errors import DressageError, EngineUnavailable, ReplyConstraintError
from dressage.proxy.chat import ChatPrompt, assistant_message, build_chat_prompt, effective_tools
from dressage.proxy.chat_params import ChatOptions, chat_messages, chat_options
from dressage.proxy.chat_reply import cut_at_stop, openai_logprobs, visible_prefix
from dressage.proxy.generation import KEEPALIVE_S, GenerationPlan, GenerationResult, run_generation
from dressage.proxy.schemas import ChatRequest, GenerateRequest
from dressage.proxy.streaming import (KEEPALIVE, ChunkWriter, aiter_frames, error_payload, replay_chunks, sse,
                                      stream_completion)
from dressage.proxy.weights import STEP_LABELS_KEY

__all__ = ["CallPath", "ChatCall", "ChatSample", "TOOL_RULE_ATTEMPTS"]

TOOL_RULE_ATTEMPTS = 4
"""Replies drawn per sample before a call under ``tool_choice`` "required" / a named function /
``parallel_tool_calls: false`` fails (:class:`~dressage.errors.ReplyConstraintError`)."""


@dataclass(slots=True)
class ChatCall:
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
    options: ChatOptions = field(default_factory=lambda: ChatOptions({}))
    plans: list[GenerationPlan] = field(default_factory=list)
    """One plan per sample (``n``); ``plans[0]`` is ``plan``."""

    @property
    def buffered(self) -> bool:
        """Streamed only once complete: several samples, or replies checked before they are shown."""
        return self.options.n > 1 or self.options.constrained


@dataclass(slots=True)
class ChatSample:
    """One accepted reply of a chat call, before it is recorded."""

    index: int
    plan: GenerationPlan
    result: GenerationResult
    message: dict[str, Any]
    stopped: bool
    """The text was cut at a stop sequence."""
    refused: int = 0
    """Replies sampled before this one and refused by the call's tool rules (not recorded)."""


class CallPath:
    """The model-call use cases; :class:`ProxyService` provides the state they use."""

    def _check_call(self, session_id: str) -> None:
        self.limits.check_call(self.core.active_session(session_id))
        self.versions.check(session_id, (self.versions.current,))

    def _next_rid(self, session_id: str) -> str:
        return f"{self._rid_prefix}-{session_id}-{next(self._rids)}"

    def _plan(self, session_id: str, prompt_ids: np.ndarray, sampling: dict[str, Any], *, stream: bool,
              tools: Any = None, boundary_reason: str | None = None) -> tuple[GenerationPlan, str]:
        """Place the call on an engine, then decide its Segment boundary (in :meth:`ProxyCore.plan`)."""
        self.engines.ensure_monitor(self.config.health_check_interval_s)
        placement = self.engines.place(session_id)
        decision = self.core.plan(session_id, prompt_ids, tools=tools, boundary_reason=boundary_reason,
                                  engine_moved=placement.moved_from is not None)
        placement.member.calls += 1
        instance = self.core.session(session_id).metadata.get("instance_id")
        plan = GenerationPlan(self._next_rid(session_id), prompt_ids, decision, sampling, placement.member.client,
                              self.core.generate_params(decision), stream, session_id=session_id,
                              instance_id=None if instance is None else str(instance))
        return plan, placement.member.url

    def _sampling(self, req: ChatRequest, prompt_len: int, options: ChatOptions | None = None) -> dict[str, Any]:
        options = options or chat_options(req)
        sp: dict[str, Any] = {"max_new_tokens": self.limits.max_new_tokens(
            req.max_completion_tokens or req.max_tokens, prompt_len),
                              "stop_token_ids": list(self.tokenizer.stop_token_ids)}
        sp.update(options.sampling)
        return sp

    # -------------------------------------------------------------- chat
    def prepare_chat(self, session_id: str, req: ChatRequest, *, turn_id: str | None = None) -> ChatCall:
        """Validate and plan a chat call (every 4xx is raised here, before any engine request)."""
        self._check_call(session_id)
        session = self.core.session(session_id)
        options = chat_options(req)
        messages = chat_messages(req)
        tools = effective_tools(req.tools, req.tool_choice)
        prompt = build_chat_prompt(session, self.tokenizer, messages, tools)
        sampling = self._sampling(req, len(prompt.prompt_ids), options)
        buffered = options.n > 1 or options.constrained
        plans, url = [], ""
        for i in range(options.n):
            plan, url = self._plan(session_id, prompt.prompt_ids, _seeded(sampling, options.sample_seed(i, 0)),
                                   stream=req.stream and not buffered, tools=tools,
                                   boundary_reason=prompt.boundary_reason)
            if options.top_logprobs:
                plan.params["top_logprobs_num"] = options.top_logprobs
            plans.append(plan)
        include_usage = bool(req.stream_options and req.stream_options.get("include_usage"))
        return ChatCall(session_id, messages, tools, prompt, plans[0], url, f"chatcmpl-{secrets.token_hex(12)}",
                        int(time.time()), include_usage, turn_id, options, plans)

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

    def _commit_task(self, call: ChatCall, samples: list[ChatSample]) -> asyncio.Future:
        task = asyncio.ensure_future(self._commit(call, samples))
        if call.turn_id is not None:
            self.turns.settle(call.session_id, call.turn_id, task)
        return task

    async def _final(self, plan: GenerationPlan) -> GenerationResult:
        result = None
        async for event in self._generate(plan):
            if isinstance(event, GenerationResult):
                result = event
        return result

    def _reply(self, call: ChatCall, index: int, plan: GenerationPlan, result: GenerationResult,
               refused: int = 0) -> ChatSample:
        """The reply's text cut at a stop sequence, parsed into the assistant message."""
        text = self.tokenizer.decode(result.response_ids.tolist(), skip_special_tokens=True)
        text, stopped = cut_at_stop(text, call.options.stops)
        prefix = f"call_{call.completion_id[-10:]}" + (f"_{index}" if index else "")
        message = assistant_message(self.parser, text, call_id_prefix=prefix,
                                    tool_calls=call.options.tool_mode != "none")
        return ChatSample(index, plan, result, message, stopped, refused)

    async def _sample(self, call: ChatCall, index: int) -> ChatSample:
        """One sample; under a tool rule, drawn again (new seed) until a reply keeps it."""
        plan, opts = call.plans[index], call.options
        attempts = TOOL_RULE_ATTEMPTS if opts.constrained else 1
        reason = None
        for attempt in range(attempts):
            if attempt:
                plan = dataclasses.replace(plan, rid=self._next_rid(call.session_id),
                                           sampling=_seeded(plan.sampling, opts.sample_seed(index, attempt)))
            sample = self._reply(call, index, plan, await self._final(plan), attempt)
            reason = opts.violation(sample.message)
            if reason is None:
                return sample
        raise ReplyConstraintError(f"{attempts} sampled replies broke the call's tool rule (last: {reason}); "
                                   "none was recorded", attempts=attempts)

    async def _samples(self, call: ChatCall) -> list[ChatSample]:
        if len(call.plans) == 1:
            return [await self._sample(call, 0)]
        tasks = [asyncio.ensure_future(self._sample(call, i)) for i in range(len(call.plans))]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            raise

    async def _complete(self, call: ChatCall) -> dict[str, Any]:
        try:
            samples = await self._samples(call)
        except BaseException as exc:
            if call.turn_id is not None:
                self.turns.abandon(call.session_id, call.turn_id, exc)
            raise
        # Shielded: an agent that hangs up now still gets its steps recorded whole, or not at all.
        return await asyncio.shield(self._commit_task(call, samples))

    async def _stream(self, call: ChatCall) -> AsyncIterator[bytes]:
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
            return await asyncio.shield(self._commit_task(call, [self._reply(call, 0, call.plan, result)]))

        writer = ChunkWriter(call.completion_id, self.config.served_model_name, call.created)
        if call.buffered:
            frames = self._buffered_frames(call)
        else:
            events = _visible(self._generate(call.plan), call.options.stops)
            frames = stream_completion(writer, self.parser, events, commit, include_usage=call.include_usage)
        try:
            async for frame in frames:
                if frame is COMMITTING:
                    committing = True
                    continue
                yield frame
        except DressageError as exc:
            if call.turn_id is not None and not committing:
                self.turns.abandon(call.session_id, call.turn_id, exc)
            self.failed_calls += 1
            yield sse(error_payload(exc))
        except BaseException as exc:
            if call.turn_id is not None and not committing:
                self.turns.abandon(call.session_id, call.turn_id, exc)
            raise

    async def _buffered_frames(self, call: ChatCall) -> AsyncIterator[bytes]:
        """Every sample generated (keep-alives meanwhile), recorded, then sent as one stream."""
        task = asyncio.ensure_future(self._samples(call))
        try:
            while not task.done():
                await asyncio.wait([task], timeout=KEEPALIVE_S)
                if not task.done():
                    yield KEEPALIVE
            samples = task.result()
        finally:
            task.cancel()
        yield COMMITTING
        response = await asyncio.shield(self._commit_task(call, samples))
        for frame in replay_chunks(response, include_usage=call.include_usage):
            yield frame

    async def _record(self, sid: str, plan: GenerationPlan, result: GenerationResult, engine_url: str, *,
                      metadata: dict[str, Any], **step_kwargs: Any) -> Any:
        """Commit one generated response as a StepRecord (the last check of the version rule first)."""
        codes = np.unique(result.token_versions).tolist()
        self.versions.check(sid, codes)
        metadata = {**metadata, "engine": engine_url, "engine_requests": result.chunks}
        labels = self.versions.labels(codes)
        if labels:
            metadata[STEP_LABELS_KEY] = labels
        step = await asyncio.to_thread(
            self.core.record_step, sid, plan.decision, prompt_ids=plan.prompt_ids, response_ids=result.response_ids,
            logprobs=result.logprobs, routed_experts=result.routed_experts, token_versions=result.token_versions,
            metadata=metadata, **step_kwargs)
        self.versions.recorded(sid, int(result.token_versions[0]))
        self.engines.settle(sid)
        return step

    async def _commit(self, call: ChatCall, samples: list[ChatSample]) -> dict[str, Any]:
        """Record each sample as its own step (siblings when ``n > 1``) and answer the completion."""
        choices, steps = [], []
        for s in samples:  # every sample may join the session, or none is recorded
            self.versions.check(call.session_id, np.unique(s.result.token_versions).tolist())
        for s in samples:
            meta: dict[str, Any] = {"assistant_message": s.message, "finish_reason": s.result.finish_reason}
            if call.options.n > 1:
                meta["sample_index"] = s.index
            if s.refused:
                meta["refused_replies"] = s.refused
            step = await self._record(call.session_id, s.plan, s.result, call.engine_url, messages=call.messages,
                                      tools=call.tools, boundary_reason=call.prompt.boundary_reason, metadata=meta)
            steps.append(step)
            finish_reason = "tool_calls" if s.message.get("tool_calls") else (
                "length" if s.result.finish_reason == "length" and not s.stopped else "stop")
            logprobs = None
            if call.options.logprobs:
                logprobs = openai_logprobs(s.result.response_ids, s.result.logprobs, s.result.top_logprobs,
                                           self._token_text, call.options.top_logprobs)
            choices.append({"index": s.index, "message": s.message, "finish_reason": finish_reason,
                            "logprobs": logprobs})
        completion = sum(st.response_len for st in steps)
        return {
            "id": call.completion_id, "object": "chat.completion", "created": call.created,
            "model": self.config.served_model_name, "choices": choices,
            "usage": {"prompt_tokens": steps[0].prompt_len, "completion_tokens": completion,
                      "total_tokens": steps[0].prompt_len + completion},
        }

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([int(token_id)], skip_special_tokens=False)

    # ------------------------------------------------------- token level
    async def generate_tokens(self, session_id: str, req: GenerateRequest) -> dict[str, Any]:
        """Token-in, token-out call for TITO-native agents (same limits, pause and versions as chat)."""
        self._check_call(session_id)
        prompt_ids = np.asarray(req.input_ids, dtype=np.int32)
        sp = dict(req.sampling_params or {})
        sp["max_new_tokens"] = self.limits.max_new_tokens(sp.get("max_new_tokens"), len(prompt_ids))
        plan, url = self._plan(session_id, prompt_ids, sp, stream=False)
        result = await self._final(plan)
        step = await self._record(session_id, plan, result, url, metadata={})
        return {"output_ids": step.response_ids.tolist(),
                "text": self.tokenizer.decode(step.response_ids.tolist(), skip_special_tokens=True),
                "step_id": step.step_id, "parent_id": step.parent_id, "lineage_id": step.lineage_id,
                "meta_info": {"finish_reason": result.finish_reason, "prompt_tokens": step.prompt_len,
                              "completion_tokens": step.response_len}}


COMMITTING = object()
"""Marks, in a buffered stream, that the call's steps are being recorded (no abandon after it)."""


def _seeded(sampling: dict[str, Any], seed: int | None) -> dict[str, Any]:
    out = dict(sampling)
    if seed is not None:
        out["sampling_seed"] = int(seed)
    return out


async def _visible(events: AsyncIterator[Any], stops: tuple[str, ...]) -> AsyncIterator[Any]:
    """Streamed reply texts as the agent may see them: never a stop sequence, nor its beginning."""
    async for event in events:
        yield visible_prefix(event, stops) if stops and isinstance(event, str) else event
