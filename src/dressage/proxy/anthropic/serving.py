"""``POST /v1/messages``: an Anthropic Messages call taken down the chat call path.

:class:`MessagesServing` turns the request into the equivalent chat request
(:mod:`dressage.proxy.anthropic.protocol`), plans and records it with
:class:`dressage.proxy.openai.chat.serving.ChatServing` (same prompt, same StepRecord, same tool
rules) and answers a Message, or its event stream (:mod:`dressage.proxy.anthropic.stream`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any, AsyncIterator

import numpy as np
from pydantic import ValidationError

from dressage.errors import DressageError
from dressage.proxy.anthropic.protocol import (CHAT_NAMES, CountTokensRequest, MessagesRequest, chat_body, count_body,
                                               invalid_body, message_ids, message_object, usage_object)
from dressage.proxy.anthropic.stream import error_event, replay_message, stream_message
from dressage.proxy.config import ProxyConfig
from dressage.proxy.openai.chat.prompt import ToolCallParser, build_chat_prompt, effective_tools
from dressage.proxy.openai.chat.serving import ChatCall, ChatServing
from dressage.proxy.recording.core import ProxyCore
from dressage.proxy.openai.streaming import aiter_frames
from dressage.proxy.recording.session_book import SessionBook
from dressage.proxy.recording.turn_scope import CallKey, CallScope
from dressage.proxy.recording.turns import TurnCache
from dressage.proxy.schemas import ChatRequest

__all__ = ["MessagesServing"]

log = logging.getLogger(__name__)

_KEPT_STOPS = 4096


class MessagesServing:
    """The Messages use case of one Proxy, over its chat serving object.

    ``parser`` reads streamed text as the chat stream does; ``turns`` (the chat path's) replays a
    retried turn; ``book`` counts failed calls and drops a header session whose first call failed.
    """

    def __init__(self, config: ProxyConfig, core: ProxyCore, tokenizer: Any, *, chat: ChatServing,
                 parser: ToolCallParser, turns: TurnCache, book: SessionBook) -> None:
        self.config, self.core, self.tokenizer = config, core, tokenizer
        self.chat, self.parser, self.turns, self.book = chat, parser, turns, book
        self._stops: OrderedDict[str, str] = OrderedDict()
        """Completion id -> the stop sequence its reply ended on (the newest ones): a replayed turn
        answers the Message it first answered, and the chat completion the turn keeps does not say."""

    def _chat_of(self, session_id: str, req: MessagesRequest) -> ChatRequest:
        self.core.session(session_id)  # an unknown session is a 404 before anything else
        try:
            return ChatRequest.model_validate(chat_body(req))
        except ValidationError as exc:
            raise invalid_body(exc, CHAT_NAMES) from None

    async def open(self, session_id: str, req: MessagesRequest, *,
                   scope: CallScope | None = None) -> dict[str, Any] | AsyncIterator[bytes]:
        """A Message (dict) or, for ``stream``, its event stream; every 4xx is raised before generation.

        ``scope`` (the call's headers) as for chat: a transport retry (an ``Idempotency-Key`` seen
        before, or the SDK's retry of an identical body) gets the recorded Message and nothing is
        recorded again; any other re-send under the same ``X-Turn-Id`` generates again (a branch).
        """
        scope = scope or CallScope()
        try:
            chat = self._chat_of(session_id, req)
            key = scope.key(chat.model_dump(exclude_none=True)) if scope != CallScope() else CallKey()
            if key.retry:
                replayed = await self._replayed(session_id, key.key, req)
                if replayed is not None:
                    return replayed
            await self.core.settled(session_id)  # the previous step's write-behind, before this call routes
            call = self.chat.prepare(session_id, chat, key=key, scope=scope)
        except BaseException:
            self.book.drop_if_unused(session_id)
            raise
        if req.stream:
            return self._stream(call, req)
        if call.cached:
            self.turns.begin(session_id, call.turn_id)
        completion = None
        try:
            async for event in self.chat.reply_events(call):
                if isinstance(event, dict):
                    completion = event
        except BaseException as exc:
            if call.commit is None:
                if call.cached:
                    self.turns.abandon(session_id, call.turn_id, exc)
                self.book.drop_if_unused(session_id)
            raise
        return self._message(call, completion, req.model)

    async def _replayed(self, session_id: str, turn_id: str,
                        req: MessagesRequest) -> dict[str, Any] | AsyncIterator[bytes] | None:
        """The Message of a turn already answered (or being answered), ``None`` for a new turn."""
        pending = self.turns.get(session_id, turn_id)
        if pending is None or pending.cancelled():
            return None
        completion = await asyncio.shield(pending)
        self.book.replayed_turns += 1
        message = message_object(completion, model=req.model, matched=self._stops.get(completion["id"]))
        return aiter_frames(replay_message(message)) if req.stream else message

    def _matched(self, call: ChatCall) -> str | None:
        """The stop sequence the reply ended on (``None``: it ended otherwise)."""
        sample = call.samples[0] if call.samples else None
        if sample is None or not sample.stopped:
            return None
        text = self.chat.calls.decode(sample.result.response_ids.tolist())
        found = [(text.find(s), s) for s in call.options.stops if s in text]
        return min(found)[1] if found else None

    def _message(self, call: ChatCall, completion: dict[str, Any], model: str) -> dict[str, Any]:
        matched = self._matched(call)
        if matched is not None and call.cached:
            self._stops[completion["id"]] = matched
            while len(self._stops) > _KEPT_STOPS:
                self._stops.popitem(last=False)
        return message_object(completion, model=model, matched=matched)

    async def _stream(self, call: ChatCall, req: MessagesRequest) -> AsyncIterator[bytes]:
        sid, model = call.session_id, req.model
        if call.cached:
            # The turn begins when the response starts, as chat's: a response that never starts must
            # not leave its retries waiting on a turn nobody runs.
            replayed = await self._replayed(sid, call.turn_id, req) if call.retry else None
            if replayed is not None:  # the attempt this retry repeats started first
                async for frame in replayed:
                    yield frame
                return
            self.turns.begin(sid, call.turn_id)
        committing = False

        def began() -> None:
            nonlocal committing
            committing = True

        skeleton = {"id": message_ids(call.completion_id)[0], "type": "message", "role": "assistant", "model": model,
                    "content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": usage_object(len(call.prompt.prompt_ids), 0)}
        try:  # reply_events counts the call in flight until its commit is done
            async for frame in stream_message(skeleton, self.parser, self.chat.reply_events(call, began),
                                              lambda completion: self._message(call, completion, model)):
                yield frame
        except Exception as exc:
            # The stream has begun (200 sent): the error is its last event.
            self.book.failed(exc)
            if not committing:
                if call.cached:
                    self.turns.abandon(sid, call.turn_id, exc)
                self.book.drop_if_unused(sid)
            if not isinstance(exc, DressageError):
                log.exception("streamed message %s failed", call.completion_id)
                exc = DressageError(f"internal error: {type(exc).__name__}")
            yield error_event(exc.http_status, str(exc))
        except BaseException as exc:
            if call.cached and not committing:
                self.turns.abandon(sid, call.turn_id, exc)
            raise

    # ------------------------------------------------------------ count_tokens
    def count_tokens(self, session_id: str | None, req: CountTokensRequest) -> dict[str, Any]:
        """``{"input_tokens": N}``: the prompt the same Messages call would send, rendered with the chat
        template (within ``session_id`` its TITO prompt; nothing is recorded)."""
        messages, tools, choice = count_body(req)
        tools = effective_tools(tools, choice)
        if session_id is not None:
            ids = build_chat_prompt(self.core.session(session_id), self.tokenizer, messages, tools).prompt_ids
        else:
            ids = np.asarray(self.tokenizer.apply_chat_template(messages, tools or None, True))
        return {"input_tokens": int(len(ids))}
