"""The path every endpoint's model call takes: admit, place and plan, generate, record one StepRecord.

:class:`ModelCalls` is the collaborator the chat, Responses and completions serving objects share;
each ends a call in one ``ProxyCore.begin_step`` (the commit region, its TQ write behind the
answer). Engine output is checked here (vocabulary, top logprobs) before anything is recorded.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, AsyncIterator, Iterable

import numpy as np

from dressage.errors import EngineUnavailable, WireFormatError
from dressage.proxy.config import ProxyConfig
from dressage.proxy.engines.generation import GenerationPlan, GenerationResult, run_generation
from dressage.proxy.engines.inflight import InflightBudget, answer_bytes
from dressage.proxy.engines.pool import EnginePool
from dressage.proxy.engines.rids import RidFactory
from dressage.proxy.recording.core import ProxyCore
from dressage.proxy.recording.limits import CallLimits
from dressage.proxy.recording.pause import RolloutPause
from dressage.proxy.recording.session_book import SessionBook
from dressage.proxy.recording.weights import STEP_LABELS_KEY, WeightVersions, codes_of

__all__ = ["ModelCalls"]


class ModelCalls:
    """Admission, placement, generation and recording of model calls, over the Proxy's collaborators."""

    def __init__(self, config: ProxyConfig, core: ProxyCore, tokenizer: Any, *, engines: EnginePool,
                 pause: RolloutPause, versions: WeightVersions, limits: CallLimits, rids: RidFactory,
                 book: SessionBook, keep_special_tokens: bool = False) -> None:
        self.config, self.core, self.tokenizer = config, core, tokenizer
        self.engines, self.pause, self.versions, self.limits = engines, pause, versions, limits
        self.rids, self.book = rids, book
        self.keep_special_tokens = keep_special_tokens
        """Reply texts keep special tokens (the reply parser's markers are special tokens: gpt-oss's
        channels, Kimi-K2's call sections); the end-of-turn tokens are left out either way."""
        budget = config.limits.inflight_bytes
        self.answer_budget = None if budget is None else InflightBudget(budget, wait_s=config.limits.inflight_wait_s)
        """Bytes of engine answers the calls in flight may hold (``limits.inflight_bytes``); None: unbounded."""
        self._stops = frozenset(int(t) for t in getattr(tokenizer, "stop_token_ids", ()) or ())

    # ------------------------------------------------------------ before the engine
    def admit(self, session_id: str) -> None:
        """A new call of an active session within its step limit, under the version the session keeps
        (raised before any engine request)."""
        self.limits.check_call(self.core.active_session(session_id))
        self.versions.check_current(session_id)
        self.book.keeper.touch(session_id)  # a use: the idle clock starts again

    def next_rid(self, session_id: str) -> str:
        return self.rids.call(session_id)

    def plan(self, session_id: str, prompt_ids: np.ndarray, sampling: dict[str, Any], *, stream: bool,
             tools: Any = None, boundary_reason: str | None = None) -> tuple[GenerationPlan, str]:
        """Place the call on an engine, then decide its Segment boundary (in :meth:`ProxyCore.plan`)."""
        self.engines.ensure_monitor(self.config.engines.health_check_interval_s)
        placement = self.engines.place(session_id)
        decision = self.core.plan(session_id, prompt_ids, tools=tools, boundary_reason=boundary_reason,
                                  engine_moved=placement.moved_from is not None)
        placement.member.calls += 1
        instance = self.core.session(session_id).metadata.get("instance_id")
        plan = GenerationPlan(self.next_rid(session_id), prompt_ids, decision, sampling, placement.member.client,
                              self.core.generate_params(decision), stream, routing_key=session_id,
                              session_id=session_id, instance_id=None if instance is None else str(instance),
                              routed_experts_spec=self.core.routed_experts_spec)
        return plan, placement.member.url

    # ------------------------------------------------------------ engine output
    def check_vocab(self, ids: list[int]) -> None:
        """An engine id the tokenizer does not know is the engine's fault (502), never a crash."""
        vocab = getattr(self.tokenizer, "vocab_size", None)
        if vocab is not None and ids and not 0 <= min(ids) <= max(ids) < vocab:
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise WireFormatError(f"the engine returned token id {bad}, outside the tokenizer's vocabulary "
                                  f"(0..{vocab - 1}): do the engine and the Proxy use the same tokenizer?")

    def decode(self, ids: list[int]) -> str:
        """The reply text of engine ids (typed errors only)."""
        self.check_vocab(ids)
        try:
            if self.keep_special_tokens:
                return self.tokenizer.decode([t for t in ids if t not in self._stops], skip_special_tokens=False)
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        except (ValueError, KeyError, IndexError, OverflowError, TypeError) as exc:
            raise WireFormatError(f"the engine's token ids do not decode: {type(exc).__name__}: {exc}") from exc

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([int(token_id)], skip_special_tokens=False)

    def _normalize(self, body: Any, **kw: Any) -> Any:
        out = self.core.normalize(body, **kw)
        self.check_vocab(out.output_ids.tolist())  # before anything is merged or recorded
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
        self.check_vocab(ids)

    # ------------------------------------------------------------ generation
    async def generate(self, plan: GenerationPlan) -> AsyncIterator[str | GenerationResult | None]:
        """Reply texts so far (``str``), keep-alives (``None``), then the :class:`GenerationResult`."""
        self.book.calls += 1
        if self.answer_budget is not None:
            tokens = len(plan.prompt_ids) + int(plan.sampling.get("max_new_tokens") or 0)
            async with self.answer_budget.hold(answer_bytes(tokens, self.core.config.r3_shape)):
                async for event in self._generate(plan):
                    yield event
            return
        async for event in self._generate(plan):
            yield event

    async def _generate(self, plan: GenerationPlan) -> AsyncIterator[str | GenerationResult | None]:
        member = self.engines.member_for(plan.client)
        if member is not None:
            member.in_flight += 1  # it gets aborts and updates while this runs, listed or not
        try:
            async for event in run_generation(
                    plan, self.pause, self._normalize, partial_rollout=self.config.sessions.partial_rollout,
                    timeout_s=self.config.engines.request_timeout_s, decode=self.decode):
                yield event
        except EngineUnavailable:
            self.engines.report_failure(plan.client)  # out of placement before the retry, and probed
            raise
        finally:
            if member is not None:
                member.in_flight -= 1

    async def final(self, plan: GenerationPlan) -> GenerationResult:
        """The whole result of a generation (its texts and keep-alives skipped)."""
        result = None
        async for event in self.generate(plan):
            if isinstance(event, GenerationResult):
                result = event
        return result

    # ------------------------------------------------------------ recording
    def check_generated(self, session_id: str, results: Iterable[GenerationResult], *,
                        expected_version: str | None = None) -> None:
        """The call's generated tokens may all join the session (checked once, before any is recorded);
        with ``expected_version`` (``X-Dressage-Expected-Version``) they must all carry that version."""
        versions = [r.token_versions for r in results]
        if expected_version is not None:
            self.versions.check_expected(session_id, expected_version, versions)
        self.versions.check_generated(session_id, versions)

    async def record(self, sid: str, plan: GenerationPlan, result: GenerationResult, engine_url: str, *,
                     metadata: dict[str, Any], committed: bool = False, **step_kwargs: Any) -> Any:
        """Commit one generated response as a StepRecord; the call checked its versions first
        (:meth:`check_generated`).

        The TQ write is behind the answer (``ProxyCore.begin_step``): this returns the validated record
        once nothing can fail but the write; ``committed`` waits for the commit as well.
        """
        metadata = {**metadata, "engine": engine_url, "engine_requests": result.chunks}
        labels = self.versions.labels(codes_of(result.token_versions))
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
        self.versions.recorded(sid, int(result.token_versions[0]), codes_of(result.token_versions))
        book = self.book
        book.recorded(sid)
        book.generated_tokens += len(result.response_ids)
        for name, value in (("logprobs", result.logprobs), ("routed_experts", result.routed_experts)):
            book.field_bytes[name] += int(getattr(value, "nbytes", 0))
        self.engines.settle(sid)
        return step
