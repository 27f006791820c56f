"""The samples of one chat call: drawn, cut at stop sequences, parsed, checked against the call's
tool rules, recorded as steps and answered as one chat completion with a choice per sample.

:class:`ChatSampler` is a collaborator of :class:`dressage.proxy.openai.chat.serving.ChatServing`
that turns engine results into choices; ``n`` samples are ``n`` engine calls of one prompt, each its own step.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator

from dressage.errors import ReplyConstraintError
from dressage.proxy.parsers import ToolCallParser, read_assistant_message
from dressage.proxy.openai.chat.reply import cut_at_stop, openai_logprobs, visible_prefix
from dressage.proxy.engines.generation import GenerationPlan, GenerationResult
from dressage.proxy.recording.turn_scope import turn_of

if TYPE_CHECKING:
    from dressage.proxy.config import ProxyConfig
    from dressage.proxy.openai.chat.serving import ChatCall
    from dressage.proxy.openai.model_calls import ModelCalls

__all__ = ["ChatSample", "ChatSampler", "TOOL_RULE_ATTEMPTS", "call_id_prefix", "seeded", "visible"]

TOOL_RULE_ATTEMPTS = 4
"""Replies drawn per sample before a call under ``parallel_tool_calls: false`` (with ``tool_choice``
"auto") fails (:class:`~dressage.errors.ReplyConstraintError`). A forced call (``"required"``, a named
function) is drawn once: the engine's grammar makes it a call (:func:`~dressage.proxy.parsers.tool_call_constraint`)."""


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


class ChatSampler:
    """Sampling, checking and recording the replies of a chat call.

    ``calls`` runs and records each sample; ``parser`` reads tool calls out of reply texts.
    """

    def __init__(self, config: "ProxyConfig", calls: "ModelCalls", parser: ToolCallParser) -> None:
        self.config, self.calls, self.parser = config, calls, parser

    async def reply(self, call: "ChatCall", index: int, plan: GenerationPlan, result: GenerationResult,
                    refused: int = 0) -> ChatSample:
        """The reply's text cut at a stop sequence, parsed into the assistant message."""
        text = self.calls.decode(result.response_ids.tolist())
        text, stopped = cut_at_stop(text, call.options.stops)
        message = await read_assistant_message(self.parser, text,
                                               call_id_prefix=call_id_prefix(call.completion_id, index),
                                               tool_calls=call.options.tool_mode != "none", tools=call.tools)
        return ChatSample(index, plan, result, message, stopped, refused)

    async def sample(self, call: "ChatCall", index: int) -> ChatSample:
        """One sample, checked against the call's tool rules.

        A forced call comes from the engine's grammar: a reply that is still no call (cut by
        ``max_tokens``, an engine that ignores the grammar) fails the call. Only the one-call rule
        of an unforced call is kept by drawing again (new seed), as nothing constrains it.
        """
        plan, opts = call.plans[index], call.options
        attempts = TOOL_RULE_ATTEMPTS if opts.single_call and opts.tool_mode == "auto" else 1
        reason = None
        for attempt in range(attempts):
            if attempt:
                plan = dataclasses.replace(plan, rid=self.calls.next_rid(call.session_id),
                                           sampling=seeded(plan.sampling, opts.sample_seed(index, attempt)))
            sample = await self.reply(call, index, plan, await self.calls.final(plan), attempt)
            reason = opts.violation(sample.message)
            if reason is None:
                return sample
        if attempts == 1:
            raise ReplyConstraintError(f"the reply broke the call's tool rule under constrained decoding ({reason}); "
                                       "it was not recorded")
        raise ReplyConstraintError(f"{attempts} sampled replies broke the call's tool rule (last: {reason}); "
                                   "none was recorded")

    async def samples(self, call: "ChatCall") -> list[ChatSample]:
        if len(call.plans) == 1:
            return [await self.sample(call, 0)]
        tasks = [asyncio.ensure_future(self.sample(call, i)) for i in range(len(call.plans))]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            raise

    async def commit(self, call: "ChatCall", samples: list[ChatSample]) -> dict[str, Any]:
        """Record each sample as its own step (siblings when ``n > 1``) and answer the completion."""
        # Every sample may join the session, or none is recorded.
        self.calls.check_generated(call.session_id, [s.result for s in samples], expected_version=call.expected_version)
        choices, steps = [], []
        for s in samples:
            meta: dict[str, Any] = {"assistant_message": s.message, "finish_reason": s.result.finish_reason}
            if call.options.n > 1:
                meta["sample_index"] = s.index
            if s.refused:
                meta["refused_replies"] = s.refused
            if call.turn_id is not None and turn_of(call.turn_id):
                meta["turn_id"] = turn_of(call.turn_id)  # finalize counts turns by it
            step = await self.calls.record(call.session_id, s.plan, s.result, call.engine_url,
                                           messages=call.messages, tools=call.tools,
                                           boundary_reason=call.prompt.boundary_reason, metadata=meta)
            steps.append(step)
            finish_reason = "tool_calls" if s.message.get("tool_calls") else (
                "length" if s.result.finish_reason == "length" and not s.stopped else "stop")
            logprobs = None
            if call.options.logprobs:
                logprobs = openai_logprobs(s.result.response_ids, s.result.logprobs, s.result.top_logprobs,
                                           self.calls.token_text, call.options.top_logprobs)
            choices.append({"index": s.index, "message": s.message, "finish_reason": finish_reason,
                            "logprobs": logprobs})
        completion = sum(st.response_len for st in steps)
        return {
            "id": call.completion_id, "object": "chat.completion", "created": call.created,
            "model": self.config.server.served_model_name, "choices": choices,
            "usage": {"prompt_tokens": steps[0].prompt_len, "completion_tokens": completion,
                      "total_tokens": steps[0].prompt_len + completion},
        }


def call_id_prefix(completion_id: str, index: int) -> str:
    """The ids of sample ``index``'s tool calls are this prefix and ``_<k>``."""
    return f"call_{completion_id[-10:]}" + (f"_{index}" if index else "")


def seeded(sampling: dict[str, Any], seed: int | None) -> dict[str, Any]:
    out = dict(sampling)
    if seed is not None:
        out["sampling_seed"] = int(seed)
    return out


async def visible(events: AsyncIterator[Any], stops: tuple[str, ...]) -> AsyncIterator[Any]:
    """Streamed reply texts as the agent may see them: never a stop sequence, nor its beginning."""
    async for event in events:
        yield visible_prefix(event, stops) if stops and isinstance(event, str) else event
