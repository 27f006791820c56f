"""``POST /v1/responses``: a Responses call taken down the chat call path.

:class:`ResponsesServing` turns the request into the equivalent chat request
(:mod:`dressage.proxy.openai.responses.protocol`), plans and records it with
:class:`dressage.proxy.openai.chat.serving.ChatServing` (same prompt, same StepRecord) and answers a
Response, or its event stream. Responses it produced are kept in ``memory`` (a
:class:`~dressage.proxy.openai.responses.protocol.ResponseMemory`) for ``previous_response_id``.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from pydantic import ValidationError

from dressage.errors import DressageError, UnsupportedParameterError
from dressage.proxy.config import ProxyConfig
from dressage.proxy.openai.chat.prompt import ToolCallParser
from dressage.proxy.openai.chat.serving import ChatCall, ChatServing
from dressage.proxy.openai.responses.protocol import (ResponseMemory, ResponsesRequest, chat_body, conversation,
                                                      item_ids, response_object)
from dressage.proxy.openai.responses.stream import ResponseEvents, replay_events, stream_response
from dressage.proxy.schemas import ChatRequest
from dressage.proxy.openai.streaming import agent_message, aiter_frames, opened
from dressage.proxy.recording.core import ProxyCore
from dressage.proxy.recording.session_book import SessionBook
from dressage.proxy.recording.turn_scope import CallScope
from dressage.proxy.recording.turns import TurnCache

__all__ = ["ResponsesServing"]


def _invalid(exc: ValidationError) -> UnsupportedParameterError:
    errors = exc.errors()
    where = ".".join(str(p) for p in errors[0].get("loc", ())) if errors else "body"
    why = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())) or 'body'}: {e.get('msg')}" for e in errors[:5])
    return UnsupportedParameterError(where or "body", f"the request has no valid chat equivalent ({why})")


class ResponsesServing:
    """The Responses use case of one Proxy, over its chat serving object.

    ``memory`` keeps the conversations of stored Responses; ``turns`` and ``book`` are the chat path's.
    """

    def __init__(self, config: ProxyConfig, core: ProxyCore, *, chat: ChatServing, memory: ResponseMemory,
                 parser: ToolCallParser, turns: TurnCache, book: SessionBook) -> None:
        self.config, self.core, self.chat = config, core, chat
        self.memory, self.parser, self.turns, self.book = memory, parser, turns, book

    def _chat_of_response(self, session_id: str, req: ResponsesRequest) -> tuple[ChatRequest, list[dict[str, Any]], int]:
        self.core.session(session_id)  # an unknown session is a 404 before anything else
        history = self.memory.recall(session_id, req.previous_response_id) if req.previous_response_id else []
        messages, n_instructions = conversation(req, history)
        if not messages:
            raise UnsupportedParameterError("input", "the request has no input (give input, instructions or "
                                                     "previous_response_id)")
        try:
            chat = ChatRequest.model_validate(chat_body(req, messages))
        except ValidationError as exc:
            raise _invalid(exc) from None
        return chat, messages, n_instructions

    def _responded(self, session_id: str, req: ResponsesRequest, completion: dict[str, Any],
                   messages: list[dict[str, Any]], n_instructions: int, *, keep_message: bool = False) -> dict[str, Any]:
        """The Response of a recorded chat completion, remembered unless ``store`` is false."""
        response = response_object(req, completion, completion_id=completion["id"], created=completion["created"],
                                   model=completion["model"], keep_message=keep_message)
        if req.store is not False:
            reply = completion["choices"][0]["message"]
            self.memory.remember(session_id, response["id"], [*messages[n_instructions:], reply])
        return response

    async def open(self, session_id: str, req: ResponsesRequest, *,
                   scope: CallScope | None = None) -> dict[str, Any] | AsyncIterator[bytes]:
        """A Response (dict) or, for ``stream``, its event stream; every 4xx is raised before generation.
        ``scope``: the call's turn and retry headers, as :meth:`ChatServing.open` takes them."""
        chat, messages, n_instructions = self._chat_of_response(session_id, req)
        if not req.stream:
            completion = await self.chat.open(session_id, chat, scope=scope)
            return self._responded(session_id, req, completion, messages, n_instructions)
        scope = scope or CallScope()
        key = scope.key(chat.model_dump(exclude_none=True))  # the key ChatServing.open uses
        if key.retry:
            pending = self.turns.get(session_id, key.key)
            if pending is not None and not pending.cancelled():
                self.book.replayed_turns += 1
                completion = await asyncio.shield(pending)
                return aiter_frames(replay_events(self._responded(session_id, req, completion, messages, n_instructions)))
        call = self.chat.prepare(session_id, chat, key=key, scope=scope)
        await self.chat.after_tool_results(call)
        # The 200 waits for the engine's first answer: a refusal or failure before it is a plain error status.
        return await opened(self._stream_response(call, req, messages, n_instructions),
                            heartbeat_s=self.config.server.stream_heartbeat_interval_s)

    async def _stream_response(self, call: ChatCall, req: ResponsesRequest, messages: list[dict[str, Any]],
                               n_instructions: int) -> AsyncIterator[bytes]:
        sid = call.session_id
        if call.cached:
            pending = self.turns.get(sid, call.turn_id) if call.retry else None
            if pending is not None:  # the attempt this retry repeats started first
                self.book.replayed_turns += 1
                completion = await asyncio.shield(pending)
                for frame in replay_events(self._responded(sid, req, completion, messages, n_instructions)):
                    yield frame
                return
            self.turns.begin(sid, call.turn_id)
        committing = False

        def began() -> None:
            nonlocal committing
            committing = True

        def finish(completion: dict[str, Any], message_open: bool) -> dict[str, Any]:
            return self._responded(sid, req, completion, messages, n_instructions, keep_message=message_open)

        model = self.config.server.served_model_name
        ev = ResponseEvents()
        skeleton = response_object(req, None, completion_id=call.completion_id, created=call.created, model=model)
        events = self.chat.reply_events(call, began)
        try:  # reply_events counts the call in flight until its commit is done
            first = await events.__anext__()  # no frame before the engine answered (see opened)
        except BaseException as exc:
            if call.cached and not committing:
                self.turns.abandon(sid, call.turn_id, exc)
            raise

        async def answered() -> AsyncIterator[Any]:
            yield first
            async for event in events:
                yield event

        try:
            async for frame in stream_response(ev, skeleton, item_ids(call.completion_id), self.parser,
                                               answered(), finish):
                yield frame
        except DressageError as exc:
            if call.cached and not committing:
                self.turns.abandon(sid, call.turn_id, exc)
            self.book.failed(exc)
            error = {"code": exc.code or type(exc).__name__, "message": agent_message(exc), "type": exc.openai_type}
            failed = response_object(req, None, completion_id=call.completion_id, created=call.created, model=model,
                                     error=error)
            yield ev.event("response.failed", response=failed)
        except BaseException as exc:
            if call.cached and not committing:
                self.turns.abandon(sid, call.turn_id, exc)
            raise
