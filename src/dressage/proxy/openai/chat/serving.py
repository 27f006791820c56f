"""``POST /v1/chat/completions`` and the token-level ``/generate``: validate, place, decide, generate, commit.

:class:`ChatServing` serves the chat (streamed or not) and token-level use cases over collaborators
the composition root (:class:`dressage.proxy.service.ProxyService`) hands it; each call ends in one
``ProxyCore.begin_step`` through :class:`~dressage.proxy.openai.model_calls.ModelCalls`. Every 4xx is
raised in :meth:`ChatServing.prepare` / before the engine request, and a failed call records nothing.
:meth:`ChatServing.serve` is the one turn, retry and stream choreography of every endpoint on the chat
path, each answering in its own shape (:class:`~dressage.proxy.openai.chat.shaper.ReplyShaper`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import numpy as np

from dressage.errors import DressageError
from dressage.proxy.config import ProxyConfig
from dressage.proxy.engine_params import name_client_param
from dressage.proxy.openai.chat.prompt import ChatPrompt, build_chat_prompt, effective_tools
from dressage.proxy.openai.chat.params import ChatOptions, chat_messages, chat_options
from dressage.proxy.openai.chat.samples import TOOL_RULE_ATTEMPTS, ChatSample, ChatSampler, seeded, visible
from dressage.proxy.openai.model_calls import ModelCalls
from dressage.proxy.parsers import tool_call_constraint
from dressage.proxy.engines.generation import KEEPALIVE_S, GenerationPlan, GenerationResult
from dressage.proxy.openai.policy import request_fields
from dressage.proxy.schemas import GENERATE_PARAMS, ChatRequest, GenerateRequest
from dressage.proxy.openai.chat.shaper import ChatShaper, ReplyEvents, ReplyShaper
from dressage.proxy.openai.streaming import aiter_frames, opened
from dressage.proxy.recording.core import ProxyCore
from dressage.proxy.recording.lifecycle import CallInFlight, InFlight
from dressage.proxy.recording.limits import CallLimits
from dressage.proxy.recording.session_book import SessionBook
from dressage.proxy.recording.turn_scope import CallKey, CallScope, turn_of
from dressage.proxy.tool_call_hooks import ToolCallContext, ToolCallHooks
from dressage.proxy.recording.turns import TurnCache

__all__ = ["ChatServing", "ChatCall", "ChatSample", "TOOL_RULE_ATTEMPTS"]

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
    """The call's key (:class:`CallKey`): its turn (``turn_of``) and what names the request; ``None``
    without a turn or retry header."""
    options: ChatOptions = field(default_factory=lambda: ChatOptions({}))
    plans: list[GenerationPlan] = field(default_factory=list)
    """One plan per sample (``n``); ``plans[0]`` is ``plan``."""
    samples: list[ChatSample] = field(default_factory=list)
    """The replies being recorded, once drawn and accepted (other wire formats read how each ended)."""
    cached: bool = False
    """Its reply is kept under ``turn_id`` for transport retries."""
    retry: bool = False
    """It is a transport retry (a concurrent first attempt under ``turn_id`` answers it)."""
    expected_version: str | None = None
    """``X-Dressage-Expected-Version``: every generated token must carry this weight version."""
    sandbox_id: str | None = None
    """``X-Dressage-Sandbox-Id``: the sandbox tool-call hooks act on (none: no hook runs)."""

    @property
    def buffered(self) -> bool:
        """Streamed only once complete (:attr:`ChatOptions.buffered`)."""
        return self.options.buffered


class ChatServing:
    """The chat and token-level generate use cases of one Proxy.

    ``calls`` runs and records model calls, ``sampler`` turns their results into choices, ``turns``
    replays a retried turn, ``book`` counts calls and drops a header session whose first call failed.
    """

    def __init__(self, config: ProxyConfig, core: ProxyCore, tokenizer: Any, *, calls: ModelCalls,
                 sampler: ChatSampler, turns: TurnCache, limits: CallLimits, in_flight: InFlight,
                 book: SessionBook, hooks: ToolCallHooks | None = None) -> None:
        self.config, self.core, self.tokenizer = config, core, tokenizer
        self.calls, self.sampler, self.turns = calls, sampler, turns
        self.limits, self.in_flight, self.book = limits, in_flight, book
        self.hooks = hooks or ToolCallHooks()

    # -------------------------------------------------------------- tool-call hooks
    def _hook_context(self, call: ChatCall, stage: str, tool_calls: list[dict[str, Any]] | None = None
                      ) -> ToolCallContext:
        session = self.core.session(call.session_id)
        turn = turn_of(call.turn_id) if call.turn_id is not None else ""
        step = len(session.steps)
        return ToolCallContext(instance_id=session.metadata.get("instance_id"), session_id=call.session_id,
                               turn_id=turn or None, step_index=step, sandbox_id=str(call.sandbox_id),
                               tool_calls=tool_calls, idempotency_key=f"{call.session_id}:{turn or '-'}:{step}:{stage}")

    async def after_tool_results(self, call: ChatCall) -> None:
        """``after_tool_call`` hooks, before generation, when the request ends with a tool result."""
        if self.hooks and call.sandbox_id and call.messages and call.messages[-1].get("role") == "tool":
            await self.hooks.dispatch("after", self._hook_context(call, "after"))

    async def _hooked_commit(self, call: ChatCall, samples: list[ChatSample]) -> Any:
        """``before_tool_call`` hooks when a reply holds tool calls, then the commit (a required hook that
        fails leaves nothing recorded)."""
        if self.hooks and call.sandbox_id:
            tool_calls = [tc for s in samples for tc in (s.message.get("tool_calls") or ())]
            if tool_calls:
                await self.hooks.dispatch("before", self._hook_context(call, "before", tool_calls))
        return await self.sampler.commit(call, samples)

    def _sampling(self, req: ChatRequest, prompt_len: int, options: ChatOptions | None = None) -> dict[str, Any]:
        options = options or chat_options(req)
        sp: dict[str, Any] = {**self.limits.sampling(req.max_completion_tokens or req.max_tokens, prompt_len),
                              "stop_token_ids": list(self.tokenizer.stop_token_ids)}
        sp.update(options.sampling)
        return sp

    # -------------------------------------------------------------- chat
    def prepare(self, session_id: str, req: ChatRequest, *, key: CallKey = CallKey(),
                scope: CallScope | None = None) -> ChatCall:
        """Validate and plan a chat call (every 4xx is raised here, before any engine request)."""
        self.calls.admit(session_id)
        session = self.core.session(session_id)
        options = chat_options(req)
        messages = chat_messages(req)
        tools = effective_tools(req.tools, req.tool_choice)
        prompt = build_chat_prompt(session, self.tokenizer, messages, tools)
        sampling = self._sampling(req, len(prompt.prompt_ids), options)
        # A forced call is the engine's to keep: a grammar of the family's call syntax, no re-draw.
        sampling.update(tool_call_constraint(tools, req.tool_choice, self.sampler.parser.name,
                                             single_call=options.single_call) or {})
        plans, url = [], ""
        for i in range(options.n):
            plan, url = self.calls.plan(session_id, prompt.prompt_ids, seeded(sampling, options.sample_seed(i, 0)),
                                        stream=req.stream and not options.buffered, tools=tools,
                                        boundary_reason=prompt.boundary_reason)
            if options.top_logprobs:
                plan.params["top_logprobs_num"] = options.top_logprobs
            plans.append(plan)
        include_usage = bool(req.stream_options and req.stream_options.get("include_usage"))
        return ChatCall(session_id, messages, tools, prompt, plans[0], url, f"chatcmpl-{secrets.token_hex(12)}",
                        int(time.time()), include_usage, key.key, options, plans, cached=key.cached, retry=key.retry,
                        expected_version=scope.expected_version if scope else None,
                        sandbox_id=scope.sandbox_id if scope else None)

    async def open(self, session_id: str, req: ChatRequest, *,
                   scope: CallScope | None = None) -> dict[str, Any] | AsyncIterator[bytes]:
        """A chat completion (dict) or, for ``stream``, its SSE byte stream (:meth:`serve`)."""
        include_usage = bool(req.stream_options and req.stream_options.get("include_usage"))
        shaper = ChatShaper(self.sampler.parser, self.config.server.served_model_name, include_usage=include_usage)
        try:
            return await self.serve(session_id, req, shaper, scope=scope)
        except DressageError as exc:
            name_client_param(exc, "chat", req.model_fields_set)  # an engine's refusal names the chat field
            raise

    async def serve(self, session_id: str, req: ChatRequest, shaper: ReplyShaper, *,
                    scope: CallScope | None = None) -> dict[str, Any] | AsyncIterator[bytes]:
        """A chat call answered in ``shaper``'s shape: its answer (dict) or, for ``stream``, its stream.

        Every endpoint that takes the chat path (Chat Completions, Responses, Anthropic Messages) comes
        here with its request translated to chat. ``scope`` (the call's headers, :class:`CallScope`):
        its turn (``X-Turn-Id``), recorded with its steps; a transport retry (an ``Idempotency-Key``
        seen before, or an SDK's retry of an identical body) gets the recorded reply (nothing generated
        or recorded again); any other re-send generates again (a branch).
        ``X-Dressage-Expected-Version`` pins the weight version.
        """
        scope = scope or CallScope()
        key = scope.key(req.model_dump(exclude_none=True)) if scope != CallScope() else CallKey()
        if key.request is not None:
            self.turns.bind(session_id, key.key, key.request)  # another request under a used key: 422
        if key.retry:
            completion = await self._replayed(session_id, key.key)
            if completion is not None:
                answer = shaper.answer(completion)
                return aiter_frames(shaper.replay(answer)) if req.stream else answer
        await self.core.settled(session_id)  # the previous step's write-behind, before this call routes
        try:
            call = self.prepare(session_id, req, key=key, scope=scope)
            await self.after_tool_results(call)
            if req.stream:
                # Its turn begins when the response starts (see _stream); the 200 goes with the first
                # frame, so a refusal or failure before it is a plain error status.
                return await opened(self._stream(call, shaper),
                                    heartbeat_s=self.config.server.stream_heartbeat_interval_s)
            if call.cached:
                self.turns.begin(session_id, call.turn_id)
            return shaper.answer(await self._complete(call), call)
        except BaseException:
            self.book.drop_if_unused(session_id)
            raise

    async def _replayed(self, session_id: str, turn_id: str) -> dict[str, Any] | None:
        """The chat completion of a turn already answered (or being answered), ``None`` for a new turn."""
        pending = self.turns.get(session_id, turn_id)
        if pending is None:
            return None
        try:
            completion = await asyncio.shield(pending)
        except asyncio.CancelledError:
            if not pending.cancelled():
                raise  # this request itself is being cancelled
            return None  # the first attempt was dropped before its commit: run it anew
        self.book.replayed_turns += 1
        return completion

    def _commit(self, call: ChatCall, running: CallInFlight, samples: list[ChatSample]) -> asyncio.Future:
        """The call's recording begun (whole, or not at all: :meth:`CallInFlight.commit`), to await."""
        call.samples = samples
        answer = running.commit(self._hooked_commit(call, samples))
        if call.cached:
            self.turns.settle(call.session_id, call.turn_id, running.recording)
        return answer

    async def _complete(self, call: ChatCall) -> dict[str, Any]:
        with self.in_flight.call(call.session_id) as running:
            try:
                samples = await self.sampler.samples(call)
            except BaseException as exc:
                if call.cached:
                    self.turns.abandon(call.session_id, call.turn_id, exc)
                raise
            return await self._commit(call, running, samples)

    async def _stream(self, call: ChatCall, shaper: ReplyShaper) -> AsyncIterator[bytes]:
        if call.cached:
            # The turn begins here, not when the call was planned: a response that never starts
            # (the agent left first) must not leave its retries waiting on a turn nobody runs.
            completion = await self._replayed(call.session_id, call.turn_id) if call.retry else None
            if completion is not None:  # the attempt this retry repeats started first
                for frame in shaper.replay(shaper.answer(completion)):
                    yield frame
                return
            self.turns.begin(call.session_id, call.turn_id)
        with self.in_flight.call(call.session_id) as running:
            frames = shaper.frames(call, self._reply_events(call, running))
            sent = False
            try:
                async for frame in frames:
                    sent = True
                    yield frame
            except Exception as exc:
                self._release_uncommitted(call, running, exc)
                if not isinstance(exc, DressageError):
                    log.exception("streamed call %s failed", call.completion_id)
                    exc = DressageError(f"internal error: {type(exc).__name__}")
                if not sent:
                    raise exc  # nothing sent yet (see opened): the agent gets the error's own status
                # The stream has begun (200 sent): the error ends it, in the endpoint's shape.
                self.book.failed(exc)
                for frame in shaper.failed(call, exc):
                    yield frame
            except BaseException as exc:
                self._release_uncommitted(call, running, exc)
                raise

    def _release_uncommitted(self, call: ChatCall, running: CallInFlight, exc: BaseException) -> None:
        """A stream that failed before its commit began: drop a session it alone created, free its turn."""
        if running.recording is not None:
            return
        self.book.drop_if_unused(call.session_id, own_calls=1)
        if call.cached:
            self.turns.abandon(call.session_id, call.turn_id, exc)

    async def _reply_events(self, call: ChatCall, running: CallInFlight) -> ReplyEvents:
        """The :data:`ReplyEvents` of a streamed call, recorded through ``running``. A buffered call
        (``n > 1``, tool rules) sends no text: its completion comes once every sample is checked."""
        if call.buffered:
            task = asyncio.ensure_future(self.sampler.samples(call))
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
            async for event in visible(self.calls.generate(call.plan), call.options.stops):
                if isinstance(event, GenerationResult):
                    result = event
                else:
                    yield event
            samples = [await self.sampler.reply(call, 0, call.plan, result)]
        yield await self._commit(call, running, samples)

    # ------------------------------------------------------- token level
    async def generate_tokens(self, session_id: str, req: GenerateRequest) -> dict[str, Any]:
        """Token-in, token-out call for TITO-native agents (same limits, pause and versions as chat)."""
        GENERATE_PARAMS.check(request_fields(req))
        await self.core.settled(session_id)
        self.calls.admit(session_id)
        prompt_ids = np.asarray(req.input_ids, dtype=np.int32)
        sp = dict(req.sampling_params or {})
        sp = {**self.limits.sampling(sp.pop("max_new_tokens", None), len(prompt_ids)), **sp}
        plan, url = self.calls.plan(session_id, prompt_ids, sp, stream=False)
        with self.in_flight.call(session_id) as running:
            try:
                result = await self.calls.final(plan)
            except DressageError as exc:
                name_client_param(exc, "generate")  # sampling_params.NAME, as the agent sent it
                raise
            self.calls.check_generated(session_id, [result])
            step = await running.commit(self.calls.record(session_id, plan, result, url, metadata={},
                                                          committed=True))  # its ids are answered
        return {"output_ids": step.response_ids.tolist(),
                "text": self.calls.decode(step.response_ids.tolist()),
                "step_id": step.step_id, "parent_id": step.parent_id, "lineage_id": step.lineage_id,
                "meta_info": {"finish_reason": result.finish_reason, "prompt_tokens": step.prompt_len,
                              "completion_tokens": step.response_len}}
