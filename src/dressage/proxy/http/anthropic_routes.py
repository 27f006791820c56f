"""HTTP routes of the Anthropic Messages API: messages, count_tokens, and the base-URL probes.

Served on a session's base URL (``/sessions/{id}/v1/messages``, any query string such as
``?beta=true``) and on ``/v1/messages`` with the session in headers. Every error raised on these
routes, a malformed body included, is answered in Anthropic's shape (``{"type": "error", ...}``)
with the status its class carries. A Messages call whose client hangs up before its answer is cancelled
(:mod:`dressage.proxy.http.hangup`).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError

from dressage.errors import DressageError, UnsupportedParameterError
from dressage.proxy import fastjson
from dressage.proxy.anthropic.protocol import (CountTokensRequest, MessagesRequest, dressage_error_object,
                                               invalid_body, is_anthropic_path)
from dressage.proxy.http.hangup import HungUp, unless_gone
from dressage.proxy.recording.turn_scope import identity_of, scope_of

__all__ = ["anthropic_router", "is_anthropic_path", "anthropic_error_response"]

_SSE_HEADERS = {"cache-control": "no-cache"}
_LONG_DIGITS = re.compile(rb"[0-9]{19}")

log = logging.getLogger(__name__)


def anthropic_error_response(book: Any, exc: DressageError) -> Response:
    """The Anthropic error answer of ``exc``; counts a failed call in ``book`` (the session book)."""
    book.failed(exc)
    headers = {"x-should-retry": "false"} if exc.http_status < 500 else None
    return JSONResponse(dressage_error_object(exc), exc.http_status, headers=headers)


async def _body(request: Request, model: type[BaseModel]) -> Any:
    raw = await request.body()
    try:
        # orjson reads an integer past 64 bits as a float: such a body is read by the standard library.
        value = json.loads(raw) if _LONG_DIGITS.search(raw) else fastjson.loads(raw)
    except ValueError as exc:
        raise UnsupportedParameterError("body", f"malformed JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UnsupportedParameterError("body", "the request body must be a JSON object")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise invalid_body(exc) from None


def anthropic_router(service: Any) -> APIRouter:
    """The routes, bound to ``service`` (a :class:`dressage.proxy.service.ProxyService`)."""
    router = APIRouter()

    async def messages(session_id: str | None, request: Request) -> Response:
        try:
            req = await _body(request, MessagesRequest)
            ident = identity_of(request.headers)
            if session_id is None:
                session_id = service.header_session(ident)
            out = await unless_gone(service.messages.open(session_id, req, scope=scope_of(request.headers)),
                                    request.receive)
        except DressageError as exc:
            return anthropic_error_response(service.book, exc)
        except Exception as exc:  # a bug still answers in the shape the client reads
            log.exception("messages call failed")
            return anthropic_error_response(service.book, DressageError(f"internal error: {type(exc).__name__}"))
        if out is None:
            return HungUp()  # the agent hung up before its answer: nothing to send it
        if isinstance(out, dict):
            return Response(fastjson.dumps(out), media_type="application/json")
        return StreamingResponse(out, media_type="text/event-stream", headers=_SSE_HEADERS)

    async def count(session_id: str | None, request: Request) -> Response:
        try:
            req = await _body(request, CountTokensRequest)
            if session_id is None:  # counting records nothing: a header session is used, never created
                named = identity_of(request.headers).session_id
                session_id = named if named in service.core.sessions else None
            return JSONResponse(service.messages.count_tokens(session_id, req))
        except DressageError as exc:
            return anthropic_error_response(service.book, exc)

    @router.post("/sessions/{session_id}/v1/messages")
    async def session_messages(session_id: str, request: Request) -> Response:
        return await messages(session_id, request)

    @router.post("/v1/messages")
    async def header_messages(request: Request) -> Response:
        return await messages(None, request)

    @router.post("/sessions/{session_id}/v1/messages/count_tokens")
    async def session_count(session_id: str, request: Request) -> Response:
        return await count(session_id, request)

    @router.post("/v1/messages/count_tokens")
    async def header_count(request: Request) -> Response:
        return await count(None, request)

    # Anthropic clients probe their base URL before the first call.
    @router.head("/sessions/{session_id}")
    async def session_probe(session_id: str) -> Response:
        return Response(status_code=200 if session_id in service.core.sessions else 404)

    @router.get("/")
    async def root() -> dict[str, Any]:
        return {"status": "ok"}

    @router.head("/")
    async def root_probe() -> Response:
        return Response(status_code=200)

    return router
