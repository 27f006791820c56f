"""One model call's path through the Proxy service: validate, place, decide, generate, commit.

:class:`CallPath` holds the chat (streamed or not) and token-level use cases of
:class:`dressage.proxy.service.ProxyService`; each ends in one ``ProxyCore.begin_step`` (the commit region, its TQ write behind the answer). Every
4xx is raised in ``prepare_chat`` / before the engine request, and a failed call records nothing.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import numpy as np

from dressage.errors import DressageError, EngineUnavailable, WireFormatError
from dressage.proxy.openai.chat.prompt import ChatPrompt, build_chat_prompt, effective_tools
from dressage.proxy.openai.chat.params import ChatOptions, chat_messages, chat_options
from dressage.proxy.openai.chat.samples import TOOL_RULE_ATTEMPTS, ChatSample, ChatSampling, seeded, visible
from dressage.proxy.engines.generation import KEEPALIVE_S, GenerationPlan, GenerationResult, run_generation
from dressage.proxy.schemas import ChatRequest, GenerateRequest
from dressage.proxy.openai.streaming import (DONE, KEEPALIVE, ChunkWriter, aiter_frames, error_payload, replay_chunks, sse,
                                      stream_completion)
from dressage.proxy.recording.weights import STEP_LABELS_KEY, codes_of
from dressage.proxy.recording.turn_scope import turn_call_key

__all__ = ["CallPath", "ChatCall", "ChatSample", "TOOL_RULE_ATTEMPTS"]

log = logging.getLogger(__name__)


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
    """The call's replay key in its turn (:func:`turn_call_key`), ``None`` without ``X-Turn-Id``."""
    options: ChatOptions = field(default_factory=lambda: ChatOptions({}))
    plans: list[GenerationPlan] = field(default_factory=list)
    """One plan per sample (``n``); ``plans[0]`` is ``plan``."""
    commit: Any = None
    """The task recording the call's steps, once it began (finalize waits for it)."""

    @property
    def buffered(self) -> bool:
        """Streamed only once complete (:attr:`ChatOptions.buffered`)."""
        return self.options.buffered


class CallPath(ChatSampling):
    """The model-call use cases; :class:`ProxyService` provides the state they use."""

    def _check_call(self, session_id: str) -> None:
        self.limits.check_call(self.core.active_session(session_id))
        self.versions.check(session_id, (self.versions.current,))
        self.keeper.touch(session_id)  # a use: the idle clock starts again

    def _next_rid(self, session_id: str) -> str:
        return self.rids.call(session_id)

    def _plan(self, session_id: str, prompt_ids: np.ndarray, sampling: dict[str, Any], *, stream: bool,
              tools: Any = None, boundary_reason: str | None = None) -> tuple[GenerationPlan, str]:
        """Place the call on an engine, then decide its Segment boundary (in :meth:`ProxyCore.plan`)."""
        self.engines.ensure_monitor(self.config.engines.health_check_interval_s)
        placement = self.engines.place(session_id)
        decision = self.core.plan(session_id, prompt_ids, tools=tools, boundary_reason=boundary_reason,
                                  engine_moved=placement.moved_from is not None)
        placement.member.calls += 1
        instance = self.core.session(session_id).metadata.get("instance_id")
        plan = GenerationPlan(self._next_rid(session_id), prompt_ids, decision, sampling, placement.member.client,
                              self.core.generate_params(decision), stream, routing_key=session_id,
                              session_id=session_id, instance_id=None if instance is None else str(instance),
                              routed_experts_spec=self.core.routed_experts_spec)
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
        plans, url = [], ""
        for i in range(options.n):
            plan, url = self._plan(session_id, prompt.prompt_ids, seeded(sampling, options.sample_seed(i, 0)),
                                   stream=req.stream and not options.buffered, tools=tools,
                                   boundary_reason=prompt.boundary_reason)
            if options.top_logprobs:
                plan.params["top_logprobs_num"] = options.top_logprobs
            plans.append(plan)
        include_usage = bool(req.stream_options and req.stream_options.get("include_usage"))
        return ChatCall(session_id, messages, tools, prompt, plans[0], url, f"chatcmpl-{secrets.token_hex(12)}",
                        int(time.time()), include_usage, turn_id, options, plans)

    async def open_chat(self, session_id: str, req: ChatRequest, *,
                        turn_id: str | None = None) -> dict[str, Any] | AsyncIterator[bytes]:
        """A chat completion (dict) or, for ``stream``, its SSE byte stream.

        ``turn_id`` (``X-Turn-Id``) scopes the call to an agent turn: the same turn sending the same
        request again gets the recorded reply (replayed once, nothing recorded again); a different
        request under that turn is the turn's next call.
        """
        if turn_id is not None:
            turn_id = turn_call_key(turn_id, req.model_dump(exclude_none=True))
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
        await self.core.settled(session_id)  # the previous step's write-behind, before this call routes
        try:
            call = self.prepare_chat(session_id, req, turn_id=turn_id)
            if req.stream:
                return self._stream(call)  # its turn begins when the response starts (see _stream)
            if turn_id is not None:
                self.turns.begin(session_id, turn_id)
            return await self._complete(call)
        except BaseException:
            self.drop_if_unused(session_id)
            raise

    async def chat(self, session_id: str, req: ChatRequest) -> dict[str, Any]:
        """Non-streamed chat completion (kept for embedders; HTTP goes through :meth:`open_chat`)."""
        await self.core.settled(session_id)
        return await self._complete(self.prepare_chat(session_id, req))

    def _check_vocab(self, ids: list[int]) -> None:
        """An engine id the tokenizer does not know is the engine's fault (502), never a crash."""
        vocab = getattr(self.tokenizer, "vocab_size", None)
        if vocab is not None and ids and not 0 <= min(ids) <= max(ids) < vocab:
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise WireFormatError(f"the engine returned token id {bad}, outside the tokenizer's vocabulary "
                                  f"(0..{vocab - 1}): do the engine and the Proxy use the same tokenizer?")

    def _decode(self, ids: list[int]) -> str:
        """The reply text of engine ids (typed errors only)."""
        self._check_vocab(ids)
        try:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        except (ValueError, KeyError, IndexError, OverflowError, TypeError) as exc:
            raise WireFormatError(f"the engine's token ids do not decode: {type(exc).__name__}: {exc}") from exc

    def _normalize(self, body: Any, **kw: Any) -> Any:
        out = self.core.normalize(body, **kw)
        self._check_vocab(out.output_ids.tolist())  # before anything is merged or recorded
        top = (getattr(out, "meta_info", None) or {}).get("output_top_logprobs")
        if top:
            self._check_top(top)
        return out

    def _check_top(self, top: Any) -> None:
        """``output_top_logprobs``: per token a list of ``[logprob, id, text]``, finite and in the vocabulary."""
        ids = []
        for i, alts in enumerate(top if isinstance(top, list) else [top]):
            for alt in alts or ():
                if not isinstance(alt, (list, tuple)) or len(alt) < 2 or isinstance(alt[1], bool) \
                        or not isinstance(alt[1], int) or isinstance(alt[0], bool) \
                        or not isinstance(alt[0], (int, float)) or not math.isfinite(alt[0]):
                    raise WireFormatError(f"meta_info.output_top_logprobs[{i}]: {str(alt)[:80]} is not "
                                          "[finite logprob, token id, text]")
                ids.append(alt[1])
        self._check_vocab(ids)

    async def _generate(self, plan: GenerationPlan) -> AsyncIterator[str | GenerationResult | None]:
        self.calls += 1
        try:
            async for event in run_generation(
                    plan, self.pause, self._normalize, partial_rollout=self.config.sessions.partial_rollout,
                    timeout_s=self.config.engines.request_timeout_s, decode=self._decode):
                yield event
        except EngineUnavailable:
            if not self.engines.single:
                task = asyncio.get_running_loop().create_task(self.engines.check())  # out before the retry
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            raise

    def _commit_task(self, call: ChatCall, samples: list[ChatSample]) -> asyncio.Future:
        task = call.commit = asyncio.ensure_future(self._commit(call, samples))
        if call.turn_id is not None:
            self.turns.settle(call.session_id, call.turn_id, task)
        return task

    async def _final(self, plan: GenerationPlan) -> GenerationResult:
        result = None
        async for event in self._generate(plan):
            if isinstance(event, GenerationResult):
                result = event
        return result

    def _leave(self, session_id: str, commit: asyncio.Future | None) -> None:
        """The call is over for finalize's wait once its commit (if one began) is done."""
        if commit is None or commit.done():
            self.in_flight.exit(session_id)
        else:
            commit.add_done_callback(lambda _: self.in_flight.exit(session_id))

    async def _complete(self, call: ChatCall) -> dict[str, Any]:
        self.in_flight.enter(call.session_id)
        try:
            try:
                samples = await self._samples(call)
            except BaseException as exc:
                if call.turn_id is not None:
                    self.turns.abandon(call.session_id, call.turn_id, exc)
                raise
            # Shielded: an agent that hangs up now still gets its steps recorded whole, or not at all.
            return await asyncio.shield(self._commit_task(call, samples))
        finally:
            self._leave(call.session_id, call.commit)

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

        def began() -> None:
            nonlocal committing
            committing = True

        writer = ChunkWriter(call.completion_id, self.config.server.served_model_name, call.created)
        if call.buffered:
            frames = self._buffered_frames(call, began)
        else:
            events = visible(self._generate(call.plan), call.options.stops)
            frames = stream_completion(writer, self.parser, events, commit, include_usage=call.include_usage)
        self.in_flight.enter(call.session_id)
        try:
            async for frame in frames:
                yield frame
        except Exception as exc:
            self._release_uncommitted(call, committing, exc)
            # The stream has begun (200 sent): the error is its last event, then [DONE].
            self.failed_calls += 1
            if not isinstance(exc, DressageError):
                log.exception("streamed call %s failed", call.completion_id)
                exc = DressageError(f"internal error: {type(exc).__name__}")
            yield sse(error_payload(exc))
            yield DONE
        except BaseException as exc:
            self._release_uncommitted(call, committing, exc)
            raise
        finally:
            self._leave(call.session_id, call.commit)

    def _release_uncommitted(self, call: ChatCall, committing: bool, exc: BaseException) -> None:
        """A stream that failed before its commit began: drop a session it alone created, free its turn."""
        if committing:
            return
        self.drop_if_unused(call.session_id, own_calls=1)
        if call.turn_id is not None:
            self.turns.abandon(call.session_id, call.turn_id, exc)

    async def _reply_events(self, call: ChatCall, on_commit: Any = None) -> AsyncIterator[str | None | dict[str, Any]]:
        """A streamed chat call for other wire formats: the reply text so far (``str``, never a stop
        sequence), keep-alives (``None``), then the recorded chat completion (``dict``);
        ``on_commit()`` runs as recording begins. A buffered call (``n > 1``, tool rules) sends no
        text: its completion comes once every sample is checked."""
        self.in_flight.enter(call.session_id)  # finalize waits for this call (its commit included)
        try:
            if call.buffered:
                task = asyncio.ensure_future(self._samples(call))
                try:
                    while not task.done():
                        await asyncio.wait([task], timeout=KEEPALIVE_S)
                        if not task.done():
                            yield None
                    samples = task.result()
                finally:
                    task.cancel()
            else:
                result = None
                async for event in visible(self._generate(call.plan), call.options.stops):
                    if isinstance(event, GenerationResult):
                        result = event
                    else:
                        yield event
                samples = [self._reply(call, 0, call.plan, result)]
            if on_commit is not None:
                on_commit()
            yield await asyncio.shield(self._commit_task(call, samples))
        finally:
            self._leave(call.session_id, call.commit)

    async def _buffered_frames(self, call: ChatCall, on_commit: Any = None) -> AsyncIterator[bytes]:
        """Every sample generated (keep-alives meanwhile), recorded, then sent as one stream."""
        response = None
        async for event in self._reply_events(call, on_commit):
            if event is None:
                yield KEEPALIVE
            else:
                response = event
        for frame in replay_chunks(response, include_usage=call.include_usage):
            yield frame

    async def _record(self, sid: str, plan: GenerationPlan, result: GenerationResult, engine_url: str, *,
                      metadata: dict[str, Any], committed: bool = False, **step_kwargs: Any) -> Any:
        """Commit one generated response as a StepRecord (the last check of the version rule first).

        The TQ write is behind the answer (``ProxyCore.begin_step``): this returns the validated record
        once nothing can fail but the write; ``committed`` waits for the commit as well.
        """
        codes = codes_of(result.token_versions)
        self.versions.check(sid, codes)
        metadata = {**metadata, "engine": engine_url, "engine_requests": result.chunks}
        labels = self.versions.labels(codes)
        if labels:
            metadata[STEP_LABELS_KEY] = labels
        step_fields = dict(prompt_ids=plan.prompt_ids, response_ids=result.response_ids, logprobs=result.logprobs,
                           routed_experts=result.routed_experts, token_versions=result.token_versions,
                           metadata=metadata, routed_experts_checked=True,  # R3 came out of core.normalize
                           **step_kwargs)
        if self.core.writes_behind:  # validates and queues only: cheap enough for the loop
            pending = self.core.begin_step(sid, plan.decision, **step_fields)
        else:  # a synchronous commit (the journal write with TQ off) runs on a thread, as it always did
            pending = await asyncio.to_thread(self.core.begin_step, sid, plan.decision, **step_fields)
        step = await asyncio.wrap_future(pending.future) if committed else pending.preview
        self.versions.recorded(sid, int(result.token_versions[0]))
        self._fresh.discard(sid)
        self.keeper.touch(sid)
        self.engines.settle(sid)
        return step

    # ------------------------------------------------------- token level
    async def generate_tokens(self, session_id: str, req: GenerateRequest) -> dict[str, Any]:
        """Token-in, token-out call for TITO-native agents (same limits, pause and versions as chat)."""
        await self.core.settled(session_id)
        self._check_call(session_id)
        prompt_ids = np.asarray(req.input_ids, dtype=np.int32)
        sp = dict(req.sampling_params or {})
        sp["max_new_tokens"] = self.limits.max_new_tokens(sp.get("max_new_tokens"), len(prompt_ids))
        plan, url = self._plan(session_id, prompt_ids, sp, stream=False)
        self.in_flight.enter(session_id)
        try:
            result = await self._final(plan)
            step = await self._record(session_id, plan, result, url, metadata={}, committed=True)  # ids answered
        finally:
            self.in_flight.exit(session_id)
        return {"output_ids": step.response_ids.tolist(),
                "text": self._decode(step.response_ids.tolist()),
                "step_id": step.step_id, "parent_id": step.parent_id, "lineage_id": step.lineage_id,
                "meta_info": {"finish_reason": result.finish_reason, "prompt_tokens": step.prompt_len,
                              "completion_tokens": step.response_len}}
