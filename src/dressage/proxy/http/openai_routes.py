"""HTTP routes of the OpenAI endpoints beyond chat: Responses, text completions, one model.

Each is served on a session's base URL (``/sessions/{id}/v1/...``) and on ``/v1/...`` with the
session in headers, like chat completions; a Responses or text-completion call whose client hangs up
before its answer is cancelled (:mod:`dressage.proxy.http.hangup`). Errors are the app's
(``DressageError`` -> OpenAI error object with the class's status).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from dressage.proxy import fastjson
from dressage.proxy.http.hangup import HungUp, unless_gone
from dressage.proxy.openai.completions import CompletionRequest
from dressage.proxy.openai.responses.protocol import ResponsesRequest
from dressage.proxy.recording.turn_scope import identity_of, scope_of

__all__ = ["openai_router"]

_SSE_HEADERS = {"cache-control": "no-cache"}


def _answer(out: Any) -> Response:
    if isinstance(out, dict):
        return Response(fastjson.dumps(out), media_type="application/json")
    return StreamingResponse(out, media_type="text/event-stream", headers=_SSE_HEADERS)


def openai_router(service: Any) -> APIRouter:
    """The routes, bound to ``service`` (a :class:`dressage.proxy.service.ProxyService`)."""
    router = APIRouter()

    def by_headers(request: Request, body: Any) -> str:
        return service.header_session(identity_of(request.headers, body))

    async def respond(session_id: str, request: Request, body: ResponsesRequest) -> Response:
        out = await unless_gone(service.responses.open(session_id, body, scope=scope_of(request.headers, body)),
                                request.receive)
        return HungUp() if out is None else _answer(out)

    @router.post("/sessions/{session_id}/v1/responses")
    async def responses(session_id: str, request: Request, body: ResponsesRequest) -> Response:
        return await respond(session_id, request, body)

    @router.post("/v1/responses")
    async def responses_by_headers(request: Request, body: ResponsesRequest) -> Response:
        return await respond(by_headers(request, body), request, body)

    async def complete(session_id: str, request: Request, body: CompletionRequest) -> Response:
        out = await unless_gone(service.completions.open(session_id, body), request.receive)
        return HungUp() if out is None else _answer(out)

    @router.post("/sessions/{session_id}/v1/completions")
    async def completions(session_id: str, request: Request, body: CompletionRequest) -> Response:
        return await complete(session_id, request, body)

    @router.post("/v1/completions")
    async def completions_by_headers(request: Request, body: CompletionRequest) -> Response:
        return await complete(by_headers(request, body), request, body)

    @router.get("/sessions/{session_id}/v1/models/{model_id:path}")
    async def session_model(session_id: str, model_id: str) -> dict[str, Any]:
        return service.models.retrieve(model_id, session_id)

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        return service.models.retrieve(model_id)

    return router
