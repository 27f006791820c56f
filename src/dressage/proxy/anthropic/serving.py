"""``POST /v1/messages``: an Anthropic Messages call taken down the chat call path.

:class:`MessagesServing` turns the request into the equivalent chat request
(:mod:`dressage.proxy.anthropic.protocol`), plans and records it with
:meth:`dressage.proxy.openai.chat.serving.ChatServing.serve` (same prompt, same StepRecord, same tool
rules, same turns) and answers a Message, or its event stream (:class:`MessageShaper`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, AsyncIterator, Iterator

import numpy as np
from pydantic import ValidationError

from dressage.errors import DressageError
from dressage.proxy.anthropic.protocol import (CHAT_NAMES, CountTokensRequest, MessagesRequest, chat_body, count_body,
                                               dressage_error_message, invalid_body, message_ids, message_object,
                                               usage_object)
from dressage.proxy.anthropic.stream import error_event, replay_message, stream_message
from dressage.proxy.config import ProxyConfig
from dressage.proxy.engine_params import name_client_param
from dressage.proxy.openai.chat.prompt import ToolCallParser, build_chat_prompt, effective_tools
from dressage.proxy.openai.chat.serving import ChatCall, ChatServing
from dressage.proxy.openai.chat.shaper import ReplyEvents
from dressage.proxy.recording.core import ProxyCore
from dressage.proxy.recording.session_book import SessionBook
from dressage.proxy.recording.turn_scope import CallScope
from dressage.proxy.schemas import ChatRequest

__all__ = ["MessagesServing", "MessageShaper"]

_KEPT_STOPS = 4096


class MessageShaper:
    """A Messages request's answers: the Message, or its event stream (:mod:`dressage.proxy.anthropic.stream`)."""

    def __init__(self, serving: "MessagesServing", model: str, sent: frozenset[str] = frozenset()) -> None:
        self.serving, self.model, self.sent = serving, model, sent

    # docstrings inherited from dressage.proxy.openai.chat.shaper.ReplyShaper
    def answer(self, completion: dict[str, Any], call: ChatCall | None = None) -> dict[str, Any]:
        return self.serving.message(completion, self.model, call)

    def replay(self, answer: dict[str, Any]) -> Iterator[bytes]:
        return replay_message(answer)

    def frames(self, call: ChatCall, events: ReplyEvents) -> AsyncIterator[bytes]:
        # message_start waits for the engine's first event: a refusal before it is a plain error status,
        # a failure after it the stream's error event.
        skeleton = {"id": message_ids(call.completion_id)[0], "type": "message", "role": "assistant",
                    "model": self.model, "content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": usage_object(len(call.prompt.prompt_ids), 0)}
        return stream_message(skeleton, self.serving.parser, events, lambda completion: self.answer(completion, call))

    def failed(self, call: ChatCall, exc: DressageError) -> Iterator[bytes]:
        name_client_param(exc, "anthropic", self.sent)  # a failure after the stream began
        yield error_event(exc.http_status, dressage_error_message(exc))


class MessagesServing:
    """The Messages use case of one Proxy, over its chat serving object.

    ``parser`` reads streamed text as the chat stream does; ``book`` drops a header session whose
    first call failed (a request with no chat equivalent included).
    """

    def __init__(self, config: ProxyConfig, core: ProxyCore, tokenizer: Any, *, chat: ChatServing,
                 parser: ToolCallParser, book: SessionBook) -> None:
        self.config, self.core, self.tokenizer = config, core, tokenizer
        self.chat, self.parser, self.book = chat, parser, book
        self._stops: OrderedDict[str, str] = OrderedDict()
        """Completion id -> the stop sequence its reply ended on (the newest ones): a replayed turn
        answers the Message it first answered, and the chat completion the turn keeps does not say."""

    def _chat_of(self, session_id: str, req: MessagesRequest) -> ChatRequest:
        self.core.session(session_id)  # an unknown session is a 404 before anything else
        try:
            return ChatRequest.model_validate(chat_body(req), context={"max_stops": None})  # Messages has no cap
        except ValidationError as exc:
            raise invalid_body(exc, CHAT_NAMES) from None

    async def open(self, session_id: str, req: MessagesRequest, *,
                   scope: CallScope | None = None) -> dict[str, Any] | AsyncIterator[bytes]:
        """A Message (dict) or, for ``stream``, its event stream; every 4xx is raised before generation.

        ``scope`` (the call's headers) as for chat (:meth:`ChatServing.serve`): a transport retry (an
        ``Idempotency-Key`` seen before, or the SDK's retry of an identical body) gets the recorded
        Message and nothing is recorded again; any other re-send under the same ``X-Turn-Id`` generates
        again (a branch).
        """
        try:
            chat = self._chat_of(session_id, req)
        except BaseException:
            self.book.drop_if_unused(session_id)
            raise
        try:
            return await self.chat.serve(session_id, chat, MessageShaper(self, req.model, frozenset(req.model_fields_set)), scope=scope)
        except DressageError as exc:
            name_client_param(exc, "anthropic", req.model_fields_set)  # stop_sequences, output_config.format, ...
            raise

    def _matched(self, call: ChatCall) -> str | None:
        """The stop sequence the reply ended on (``None``: it ended otherwise)."""
        sample = call.samples[0] if call.samples else None
        if sample is None or not sample.stopped:
            return None
        text = self.chat.calls.decode(sample.result.response_ids.tolist())
        found = [(text.find(s), s) for s in call.options.stops if s in text]
        return min(found)[1] if found else None

    def message(self, completion: dict[str, Any], model: str, call: ChatCall | None) -> dict[str, Any]:
        """The Message of a recorded chat completion; ``call`` is the call that just recorded it
        (``None``: a retried turn, whose stop sequence was kept when it was first answered)."""
        if call is None:
            return message_object(completion, model=model, matched=self._stops.get(completion["id"]))
        matched = self._matched(call)
        if matched is not None and call.cached:
            self._stops[completion["id"]] = matched
            while len(self._stops) > _KEPT_STOPS:
                self._stops.popitem(last=False)
        return message_object(completion, model=model, matched=matched)

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
