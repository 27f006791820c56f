"""``POST /v1/responses``: a Responses call taken down the chat call path.

:class:`ResponsesServing` turns the request into the equivalent chat request
(:mod:`dressage.proxy.openai.responses.protocol`), plans and records it with
:meth:`dressage.proxy.openai.chat.serving.ChatServing.serve` (same prompt, same StepRecord, same turns)
and answers a Response, or its event stream (:class:`ResponseShaper`). Responses it produced are kept in ``memory`` (a
:class:`~dressage.proxy.openai.responses.protocol.ResponseMemory`) for ``previous_response_id``.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Iterator

from pydantic import ValidationError

from dressage.errors import DressageError, UnsupportedParameterError
from dressage.proxy.config import ProxyConfig
from dressage.proxy.engine_params import name_client_param
from dressage.proxy.openai.chat.prompt import ToolCallParser
from dressage.proxy.openai.chat.serving import ChatCall, ChatServing
from dressage.proxy.openai.chat.shaper import ReplyEvents
from dressage.proxy.openai.responses.protocol import (ResponseMemory, ResponsesRequest, chat_body, conversation,
                                                      item_ids, response_object)
from dressage.proxy.openai.responses.stream import ResponseEvents, replay_events, stream_response
from dressage.proxy.schemas import ChatRequest
from dressage.proxy.openai.streaming import agent_message
from dressage.proxy.recording.core import ProxyCore
from dressage.proxy.recording.turn_scope import CallScope

__all__ = ["ResponsesServing", "ResponseShaper"]


def _invalid(exc: ValidationError) -> UnsupportedParameterError:
    errors = exc.errors()
    where = ".".join(str(p) for p in errors[0].get("loc", ())) if errors else "body"
    why = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())) or 'body'}: {e.get('msg')}" for e in errors[:5])
    return UnsupportedParameterError(where or "body", f"the request has no valid chat equivalent ({why})")


class ResponsesServing:
    """The Responses use case of one Proxy, over its chat serving object.

    ``memory`` keeps the conversations of stored Responses; ``parser`` reads streamed text as the chat
    stream does.
    """

    def __init__(self, config: ProxyConfig, core: ProxyCore, *, chat: ChatServing, memory: ResponseMemory,
                 parser: ToolCallParser) -> None:
        self.config, self.core, self.chat = config, core, chat
        self.memory, self.parser = memory, parser

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

    async def open(self, session_id: str, req: ResponsesRequest, *,
                   scope: CallScope | None = None) -> dict[str, Any] | AsyncIterator[bytes]:
        """A Response (dict) or, for ``stream``, its event stream; every 4xx is raised before generation.
        ``scope``: the call's turn and retry headers, as :meth:`ChatServing.serve` takes them."""
        chat, messages, n_instructions = self._chat_of_response(session_id, req)
        shaper = ResponseShaper(self, session_id, req, messages, n_instructions)
        try:
            return await self.chat.serve(session_id, chat, shaper, scope=scope)
        except DressageError as exc:
            name_client_param(exc, "responses", req.model_fields_set)  # max_output_tokens, text.format, ...
            raise


class ResponseShaper:
    """A Responses request's answers: the Response (remembered unless ``store`` is false), or its events."""

    def __init__(self, serving: ResponsesServing, session_id: str, req: ResponsesRequest,
                 messages: list[dict[str, Any]], n_instructions: int) -> None:
        self.serving, self.session_id, self.req = serving, session_id, req
        self.messages, self.n_instructions = messages, n_instructions
        self.ev = ResponseEvents()  # numbers the events of the stream, its failure event included

    def respond(self, completion: dict[str, Any], *, keep_message: bool = False) -> dict[str, Any]:
        """The Response of a recorded chat completion, remembered unless ``store`` is false."""
        req = self.req
        response = response_object(req, completion, completion_id=completion["id"], created=completion["created"],
                                   model=completion["model"], keep_message=keep_message)
        if req.store is not False:
            reply = completion["choices"][0]["message"]
            self.serving.memory.remember(self.session_id, response["id"], [*self.messages[self.n_instructions:], reply])
        return response

    # docstrings inherited from dressage.proxy.openai.chat.shaper.ReplyShaper
    def answer(self, completion: dict[str, Any], call: ChatCall | None = None) -> dict[str, Any]:
        return self.respond(completion)

    def replay(self, answer: dict[str, Any]) -> Iterator[bytes]:
        return replay_events(answer)

    async def frames(self, call: ChatCall, events: ReplyEvents) -> AsyncIterator[bytes]:
        first = await events.__anext__()  # no frame before the engine answered (see opened)

        async def answered() -> AsyncIterator[Any]:
            yield first
            async for event in events:
                yield event

        skeleton = self._object(call)
        async for frame in stream_response(self.ev, skeleton, item_ids(call.completion_id), self.serving.parser,
                                           answered(),
                                           lambda completion, open_: self.respond(completion, keep_message=open_)):
            yield frame

    def failed(self, call: ChatCall, exc: DressageError) -> Iterator[bytes]:
        error = {"code": exc.code or type(exc).__name__, "message": agent_message(exc), "type": exc.openai_type}
        yield self.ev.event("response.failed", response=self._object(call, error=error))

    def _object(self, call: ChatCall, **fields: Any) -> dict[str, Any]:
        """The Response before its output is known (in progress, or failed with ``error``)."""
        return response_object(self.req, None, completion_id=call.completion_id, created=call.created,
                               model=self.serving.config.server.served_model_name, **fields)
