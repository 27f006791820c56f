"""The Proxy's HTTP module: thin FastAPI routes over :class:`dressage.proxy.service.ProxyService`.

Each route parses its body (pydantic schemas), looks up the serving object of its endpoint on the
service and calls one method, and returns its value as JSON. The hot routes (session create, chat,
generate, finalize) are reached first through :class:`dressage.proxy.http.fast_routes.FastRoutes`
(:class:`HotFirst`), with the same schemas and calls. A :class:`dressage.errors.DressageError` becomes an
OpenAI-style error with the status and type the class carries (``http_status``, ``openai_type``).
Agents use ``/sessions/{id}/v1`` as an OpenAI base URL (``/sessions/{id}`` as an Anthropic one), or
``/v1`` with session headers; the Messages routes answer errors in Anthropic's shape.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.errors import ServerErrorMiddleware

from dressage.observe.context import bind_call
from dressage.observe.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from dressage.proxy import fastjson
from dressage.proxy.engines import server_timing
from dressage.errors import BadHttpRequestError, DressageError, HeadersTooLargeError, RequestRejected
from dressage.proxy.http.anthropic_routes import anthropic_error_response, anthropic_router, is_anthropic_path
from dressage.proxy.http.fast_routes import FastRoutes, dressage_error_response, listener_url
from dressage.proxy.http.guard import RequestGuard, rejection
from dressage.proxy.http.hangup import HungUp, unless_gone
from dressage.proxy.http.upstream_routes import upstream_router
from dressage.proxy.http.openai_routes import openai_router
from dressage.proxy.http.rollout_routes import rollout_router
from dressage.proxy.http.viewer_routes import viewer_router
from dressage.proxy.schemas import BAD_REQUEST_ERRORS, ChatRequest, CreateSession, GenerateRequest
from dressage.proxy.anthropic.protocol import error_object
from dressage.proxy.openai.streaming import error_body
from dressage.proxy.recording.turn_scope import identity_of, scope_of
from dressage.serving import ConnectionLimits, Refused, UvicornServer

__all__ = ["build_app", "fastapi_app", "HotFirst", "ProxyServer", "status_for"]

log = logging.getLogger(__name__)


def status_for(exc: DressageError) -> tuple[int, str]:
    """HTTP status and OpenAI error type of a Dressage error (the class attributes)."""
    return exc.http_status, exc.openai_type


def _json(value: Any) -> Response:
    # orjson (see fastjson) writes long token lists many times faster than pydantic or the stdlib.
    return Response(fastjson.dumps(value), media_type="application/json")


def _guard_kwargs(service: Any) -> dict[str, Any]:
    cfg = service.config
    return {"agent_token": cfg.access.api_token, "admin_token": cfg.access.admin_token,
            "max_body_bytes": cfg.server.max_body_bytes, "on_reject": service.book.failed}


def _install_guards(app: FastAPI, service: Any) -> None:
    # Tokens, the received-bytes body limit and the JSON value check: see dressage.proxy.http.guard.
    app.add_middleware(RequestGuard, **_guard_kwargs(service))

    @app.exception_handler(DressageError)
    async def dressage_error(request: Request, exc: DressageError):
        if is_anthropic_path(request.url.path):
            return anthropic_error_response(service.book, exc)
        return dressage_error_response(service.book, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        response = _invalid(request, exc)
        service.book.failed_status(response.status_code, "invalid_request")
        return response

    def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            detail = (first.get("ctx") or {}).get("error", first.get("msg"))
            return JSONResponse(error_body(f"malformed JSON: {detail}", "invalid_request_error"), 400)
        if tuple(first.get("loc", ())) == ("body",):
            kind = request.headers.get("content-type", "")
            hint = "" if "json" in kind.lower() else \
                f" sent as application/json (this one came as {kind[:60] or 'no Content-Type'})"
            return JSONResponse(error_body(f"request body must be a JSON object{hint}", "invalid_request_error"), 400)
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        msg = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
                        for e in errors[:5])
        # A key a strict (control) body does not know, a boolean for a number, JSON nested too deep or a
        # value nothing can store is a bad request, not a bad value.
        malformed = any(e.get("type") in BAD_REQUEST_ERRORS for e in errors)
        return JSONResponse(error_body(msg, "invalid_request_error", param=param), 400 if malformed else 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # A 405 carries its Allow header (the methods the path takes).
        headers = getattr(exc, "headers", None)
        detail = str(exc.detail)
        cause = exc.__cause__
        if exc.status_code == 400 and cause is not None and "parsing the body" in detail:
            # FastAPI's words for a body no JSON parser got to read: say why (not UTF-8, say).
            detail = f"malformed JSON: the body could not be read ({type(cause).__name__}: {str(cause)[:200]})"
        if exc.status_code >= 400:
            service.book.failed_status(exc.status_code, "invalid_request" if exc.status_code == 400 else
                                       {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error"))
        if is_anthropic_path(request.url.path):
            return JSONResponse(error_object(exc.status_code, detail), exc.status_code, headers=headers)
        return JSONResponse(error_body(detail, "invalid_request_error"), exc.status_code, headers=headers)


def build_app(service: Any) -> "HotFirst":
    """The ASGI app a Proxy serves: :func:`fastapi_app`'s routes, its hot ones reached first."""
    return HotFirst(fastapi_app(service), service)


def fastapi_app(service: Any) -> FastAPI:
    """The FastAPI app: one route per use case of ``service``."""
    # No /docs or /redoc pages: both load their scripts from a CDN. The schema stays at /openapi.json.
    app = FastAPI(title="Dressage Proxy", version="0.1.0", docs_url=None, redoc_url=None)
    _install_guards(app, service)
    app.include_router(upstream_router(service))

    async def answer(session_id: str, request: Request, body: ChatRequest) -> Response:
        out = await unless_gone(service.chat.open(session_id, body, scope=scope_of(request.headers, body)),
                                request.receive)
        if out is None:
            return HungUp()
        if isinstance(out, dict):
            return _json(out)
        return StreamingResponse(out, media_type="text/event-stream", headers={"cache-control": "no-cache"})

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return service.health()

    @app.post("/sessions")
    async def create_session(request: Request, body: CreateSession | None = None) -> dict[str, Any]:
        return service.create_session(body.metadata if body else None,
                                      listener_url(request.scope, service.config.server.public_url))

    @app.post("/sessions/{session_id}/v1/chat/completions")
    async def chat(session_id: str, request: Request, body: ChatRequest) -> Response:
        return await answer(session_id, request, body)

    @app.post("/v1/chat/completions")
    async def chat_by_headers(request: Request, body: ChatRequest) -> Response:
        return await answer(service.header_session(identity_of(request.headers, body)), request, body)

    @app.get("/v1/models")
    async def all_models() -> dict[str, Any]:
        return service.models.list()

    @app.get("/sessions/{session_id}/v1/models")
    async def models(session_id: str) -> dict[str, Any]:
        return service.models.list(session_id)

    @app.post("/sessions/{session_id}/generate")
    async def generate(session_id: str, request: Request, body: GenerateRequest) -> Response:
        out = await unless_gone(service.chat.generate_tokens(session_id, body), request.receive)
        return HungUp() if out is None else _json(out)

    @app.post("/sessions/{session_id}/abort")
    async def abort(session_id: str) -> dict[str, Any]:
        return service.trajectories.abort(session_id)

    @app.get("/sessions/{session_id}/segments")
    async def segments(session_id: str) -> Response:
        return _json(service.trajectories.segments(session_id))

    @app.get("/trajectory/stats")
    async def trajectory_stats() -> dict[str, Any]:
        return service.stats()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.get("/v1/engines")
    async def engines() -> dict[str, Any]:
        return await service.engine_state()

    app.include_router(openai_router(service))
    app.include_router(anthropic_router(service))

    @app.get("/sessions/{session_id}")
    async def session_info(session_id: str) -> dict[str, Any]:
        return service.session_info(session_id)

    app.include_router(rollout_router(service))
    app.include_router(viewer_router(service))
    return app


class HotFirst:
    """The ASGI app the Proxy serves: :func:`fastapi_app`'s, with its hot routes reached first.

    A request for a hot route (:class:`FastRoutes`, installed here and nowhere else) goes through
    the same guard as the app's and :class:`FastRoutes`, behind the same 500 answer for a crash
    (Starlette's ``ServerErrorMiddleware``), without FastAPI's and Starlette's layers in front of
    them (their telemetry check, app scope and body-limit wrappers: ~5 % of a profile of the event
    loop). Every other request, one under a mounted root path, and every one that
    :class:`FastRoutes` hands on (it does not parse or validate) goes to the FastAPI app, whose own
    routes for the same paths give the same answers.
    """

    def __init__(self, app: FastAPI, service: Any) -> None:
        self.app = app
        self._fast = FastRoutes(app, service=service)
        self._metrics, self._service = service.metrics, service
        self._hot = ServerErrorMiddleware(RequestGuard(self._fast, **_guard_kwargs(service)), debug=app.debug)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # The call's ids (log lines, the engine's traceparent) and its engine-wait tally, for every route.
        call = bind_call(traceparent=_header(scope, b"traceparent"), session_id=_session_of(scope))
        tracing = self._service.tracing
        if tracing is not None:
            tracing.start_call(call, f"{scope.get('method')} {scope.get('path')}", session_id=call.session_id,
                               call_id=call.call_id)
        tally = server_timing.start()
        began = time.perf_counter()
        try:
            if not self.app.root_path and self._fast.route(scope) is not None:
                await self._hot(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        finally:
            if tracing is not None:
                tracing.end_call(call)
            if tally.calls:  # a model call: it reached the engine
                seconds = time.perf_counter() - began
                self._metrics.observe_call(seconds, tally.seconds)
                if log.isEnabledFor(logging.INFO):
                    log.info("model call %s %s: %.3f s, engine %.3f s", scope.get("method"), scope.get("path"),
                             seconds, tally.seconds)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def _session_of(scope: dict[str, Any]) -> str | None:
    """The session a request names: its ``/sessions/{id}/...`` path, else its session header."""
    path = scope.get("path", "")
    if path.startswith("/sessions/"):
        sid = path[10:].split("/", 1)[0]
        return sid or None
    return _header(scope, b"x-session-id") or _header(scope, b"x-smg-routing-key")


class ProxyServer(UvicornServer):
    """The Proxy app under uvicorn; ``start_background()`` for tests and in-process use."""

    def __init__(self, service: Any) -> None:
        self.service = service
        cfg = service.config.server
        limits = ConnectionLimits(header_timeout_s=cfg.header_timeout_s, body_timeout_s=cfg.body_timeout_s,
                                  keep_alive_s=cfg.keep_alive_timeout_s, max_header_bytes=cfg.max_header_bytes)
        super().__init__(build_app(service), host=cfg.host, port=cfg.port, name="proxy",
                         limits=limits, own_log_handlers=cfg.log_format == "text", refuse_head=self._refuse_head)

    def _refuse_head(self, path: str | None, why: Refused) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        # Headers over the limit and what the HTTP parser cannot read are answered by the connection, before
        # any route: in the Proxy's error shape too.
        if why is Refused.HEADERS_TOO_LARGE:
            exc: RequestRejected = HeadersTooLargeError(
                f"request line and headers over {self.limits.max_header_bytes} bytes")
        else:
            exc = BadHttpRequestError("malformed HTTP request: its request line, a header or its body's framing "
                                      "(chunk sizes, Content-Length) is not HTTP/1.1")
        self.service.book.failed(exc)
        return rejection(exc, path)

    async def after_serving(self) -> None:
        await self.service.aclose()  # the engine clients' pools live on this loop
