"""The Proxy's hot routes as plain ASGI, in front of the FastAPI app (:class:`dressage.proxy.http.app.HotFirst`).

Every agent call goes through a few routes: ``POST /sessions``, chat completions (on a session's
base URL and on ``/v1`` with session headers), ``/sessions/{id}/generate`` and
``/sessions/{id}/finalize``. FastAPI's routing, dependency solving and response model machinery
cost more CPU per request than the Proxy's own work on a short call, so these are served here:
the same pydantic schemas, the same service calls in the same order, and the same answers.

Only a request that parses and validates is answered here. Anything else (another content type,
malformed JSON, a body the schema refuses, a mounted root path) goes on, body and all, to the
FastAPI app, which gives it the exact 400 / 422 it always gave. A :class:`DressageError` raised by
the service is answered as the app's handler answers it (:func:`dressage_error_response`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Awaitable, Callable

from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response, StreamingResponse

from dressage.errors import DressageError
from dressage.proxy import fastjson
from dressage.proxy.engines import server_timing
from dressage.proxy.http.guard import replay_body
from dressage.proxy.http.hangup import unless_gone
from dressage.proxy.schemas import ChatRequest, CreateSession, FinalizeRequest, GenerateRequest
from dressage.proxy.openai.streaming import error_payload
from dressage.proxy.recording.turn_scope import identity_of, scope_of

__all__ = ["FastRoutes", "dressage_error_response", "listener_url"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_SESSION_ROUTE = re.compile(r"/sessions/([^/]+)/(v1/chat/completions|generate|finalize)")
_SSE_HEADERS = {"cache-control": "no-cache"}
_LONG_DIGITS = re.compile(rb"[0-9]{19}")
_REFUSED = object()
"""Not for the fast path: the FastAPI app answers (and words the error)."""


def dressage_error_response(book: Any, exc: DressageError) -> Response:
    """The OpenAI-style error answer of ``exc``; counts a failed call in ``book`` (the session book)."""
    book.failed(exc)
    # A 4xx here is final (a retry gets the same answer): tell OpenAI clients not to retry it. So is a
    # rollout the weights invalidated (a 502 for upstream's harness, not an engine fault to retry).
    final = exc.http_status < 500 or getattr(exc, "upstream_detail", False)
    headers = {"x-should-retry": "false"} if final else None
    return JSONResponse(error_payload(exc), exc.http_status, headers=headers)


def listener_url(scope: Scope, public_url: str | None) -> str:
    """The Proxy's base URL for an answer to send agents to: ``public_url`` when configured, else the
    address the request's connection reached (its socket), never the client's ``Host`` header, which
    the client chooses and which would send the next agent wherever it says."""
    if public_url:
        return public_url
    host, port = scope.get("server") or ("127.0.0.1", None)
    scheme = "https" if scope.get("scheme") == "https" else "http"
    host = f"[{host}]" if ":" in str(host) else str(host)
    default = port is None or (scheme, port) in (("http", 80), ("https", 443))
    return f"{scheme}://{host}{'' if default else f':{port}'}{scope.get('root_path', '')}/"


def _json_body(scope: Scope) -> bool:
    """Whether the content type is one FastAPI reads as JSON (``application/json``, ``+json``)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
            return kind == b"application/json" or (kind.startswith(b"application/") and kind.endswith(b"+json"))
    return False


def _parse(scope: Scope, body: bytes, model: type[BaseModel], optional: bool) -> Any:
    """The validated body, ``None`` (an optional body left out) or :data:`_REFUSED`."""
    if not body:
        return None if optional else _REFUSED
    if not _json_body(scope):
        return _REFUSED
    try:
        # orjson reads an integer past 64 bits as a float: such a body is read by the standard library.
        value = json.loads(body) if _LONG_DIGITS.search(body) else fastjson.loads(body)
        return model.model_validate(value)
    except (ValueError, RecursionError, ValidationError):
        return _REFUSED


async def _read(receive: Receive) -> bytes | None:
    """The whole request body; ``None`` when the client went away first."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def _json(value: Any, tally: server_timing.Tally | None = None) -> Response:
    headers = None if tally is None else {"server-timing": server_timing.header_value(tally)}
    return Response(fastjson.dumps(value), media_type="application/json", headers=headers)


class FastRoutes:
    """ASGI middleware: the hot routes of ``service``; every other request goes to ``app``."""

    def __init__(self, app: Any, *, service: Any) -> None:
        self.app, self.service = app, service

    def route(self, scope: Scope) -> tuple[str, str | None] | None:
        """``(kind, session id)`` of a hot route; ``None`` for any other request."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        path = scope["path"]
        if path == "/sessions":
            return "create", None
        if path == "/v1/chat/completions":
            return "chat", None
        m = _SESSION_ROUTE.fullmatch(path)
        if m is None:
            return None
        return {"v1/chat/completions": "chat", "generate": "generate", "finalize": "finalize"}[m.group(2)], m.group(1)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.route(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        kind, session_id = route
        body = await _read(receive)
        if body is None:
            return  # the client is gone: nothing to answer
        model, optional = {"create": (CreateSession, True), "chat": (ChatRequest, False),
                           "generate": (GenerateRequest, False), "finalize": (FinalizeRequest, True)}[kind]
        req = _parse(scope, body, model, optional)
        if req is _REFUSED:
            await self.app(scope, replay_body(body, receive), send)
            return
        try:
            if kind in ("chat", "generate"):
                response = await unless_gone(self._answer(kind, session_id, scope, req), receive)
                if response is None:
                    return  # the agent hung up before its answer: nothing to send it
            else:
                response = await self._answer(kind, session_id, scope, req)
        except DressageError as exc:
            response = dressage_error_response(self.service.book, exc)
        await response(scope, receive, send)

    async def _answer(self, kind: str, session_id: str | None, scope: Scope, req: Any) -> Response:
        service = self.service
        if kind == "chat":
            headers = Headers(scope=scope)
            if session_id is None:
                session_id = service.header_session(identity_of(headers, req))
            tally = server_timing.current()  # the app's, which the call's metrics read
            out = await service.chat.open(session_id, req, scope=scope_of(headers, req))
            if isinstance(out, dict):
                return _json(out, tally)
            return StreamingResponse(out, media_type="text/event-stream", headers=_SSE_HEADERS)
        if kind == "create":
            return _json(service.create_session(req.metadata if req else None,
                                                listener_url(scope, service.config.server.public_url)))
        if kind == "generate":
            tally = server_timing.current()  # the app's, which the call's metrics read
            return _json(await service.chat.generate_tokens(session_id, req), tally)
        req = req or FinalizeRequest()
        return _json(await service.trajectories.finalize_session(session_id, reward=req.reward,
                                                                 instance_id=req.instance_id, label=req.label,
                                                                 wait_s=req.wait_s))
