"""``POST /v1/messages``: an Anthropic Messages call taken down the chat call path.

:class:`MessagesServing` turns the request into the equivalent chat request
(:mod:`dressage.proxy.anthropic.protocol`), plans and records it with
:class:`dressage.proxy.openai.chat.serving.ChatServing` (same prompt, same StepRecord, same tool
rules) and answers a Message, or its event stream (:mod:`dressage.proxy.anthropic.stream`).
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator

import numpy as np
from pydantic import ValidationError

from dressage.errors import DressageError
from dressage.proxy.anthropic.protocol import (CHAT_NAMES, CountTokensRequest, MessagesRequest, chat_body, count_body,
                                               invalid_body, message_ids, message_object, usage_object)
from dressage.proxy.anthropic.stream import error_event, stream_message
from dressage.proxy.config import ProxyConfig
from dressage.proxy.openai.chat.prompt import ToolCallParser, build_chat_prompt, effective_tools
from dressage.proxy.openai.chat.serving import ChatCall, ChatServing
from dressage.proxy.recording.core import ProxyCore
from dressage.proxy.recording.session_book import SessionBook
from dressage.proxy.schemas import ChatRequest

__all__ = ["MessagesServing"]

log = logging.getLogger(__name__)


class MessagesServing:
    """The Messages use case of one Proxy, over its chat serving object.

    ``parser`` reads streamed text as the chat stream does; ``book`` counts failed calls and drops a
    header session whose first call failed.
    """

    def __init__(self, config: ProxyConfig, core: ProxyCore, tokenizer: Any, *, chat: ChatServing,
                 parser: ToolCallParser, book: SessionBook) -> None:
        self.config, self.core, self.tokenizer = config, core, tokenizer
        self.chat, self.parser, self.book = chat, parser, book

    def _chat_of(self, session_id: str, req: MessagesRequest) -> ChatRequest:
        self.core.session(session_id)  # an unknown session is a 404 before anything else
        try:
            return ChatRequest.model_validate(chat_body(req))
        except ValidationError as exc:
            raise invalid_body(exc, CHAT_NAMES) from None

    async def open(self, session_id: str, req: MessagesRequest) -> dict[str, Any] | AsyncIterator[bytes]:
        """A Message (dict) or, for ``stream``, its event stream; every 4xx is raised before generation."""
        try:
            chat = self._chat_of(session_id, req)
            await self.core.settled(session_id)  # the previous step's write-behind, before this call routes
            call = self.chat.prepare(session_id, chat)
        except BaseException:
            self.book.drop_if_unused(session_id)
            raise
        if req.stream:
            return self._stream(call, req.model)
        completion = None
        try:
            async for event in self.chat.reply_events(call):
                if isinstance(event, dict):
                    completion = event
        except BaseException:
            if call.commit is None:
                self.book.drop_if_unused(session_id)
            raise
        return self._message(call, completion, req.model)

    def _matched(self, call: ChatCall) -> str | None:
        """The stop sequence the reply ended on (``None``: it ended otherwise)."""
        sample = call.samples[0] if call.samples else None
        if sample is None or not sample.stopped:
            return None
        text = self.chat.calls.decode(sample.result.response_ids.tolist())
        found = [(text.find(s), s) for s in call.options.stops if s in text]
        return min(found)[1] if found else None

    def _message(self, call: ChatCall, completion: dict[str, Any], model: str) -> dict[str, Any]:
        return message_object(completion, model=model, matched=self._matched(call))

    async def _stream(self, call: ChatCall, model: str) -> AsyncIterator[bytes]:
        sid = call.session_id
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
            self.book.failed_calls += 1
            if not committing:
                self.book.drop_if_unused(sid)
            if not isinstance(exc, DressageError):
                log.exception("streamed message %s failed", call.completion_id)
                exc = DressageError(f"internal error: {type(exc).__name__}")
            yield error_event(exc.http_status, str(exc))

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
