"""FastAPI routes of the Proxy: sessions, the OpenAI chat API (per-session base URL or session
headers, streamed or not), finalize, trajectories and stats, rollout pause / resume, engines."""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dressage.errors import (ChatTemplateError, ConfigError, DressageError, EngineError, EngineRequestError,
                             EngineTimeout, FieldError, SessionStateError, TransferQueueError, TrajectoryError,
                             UnknownStepError, WireFormatError)
from dressage.proxy.errors import (ContextOverflowError, MissingSessionIdError, NoHealthyEngineError, SessionIdError,
                                   WeightVersionChangedError)
from dressage.proxy.schemas import (ChatRequest, CreateSession, FinalizeRequest, FinalizeSessionRequest, GenerateRequest,
                                    ResumeRequest, TrajectoryReadRequest)
from dressage.proxy.sessions import identity_from_headers

__all__ = ["build_app", "error_body", "status_for"]


def status_for(exc: DressageError) -> tuple[int, str]:
    """HTTP status and OpenAI error type for a Dressage error."""
    if isinstance(exc, (ContextOverflowError, SessionIdError)):
        return 400, "invalid_request_error"
    if isinstance(exc, WeightVersionChangedError):
        return 409, "weight_version_changed"
    if isinstance(exc, NoHealthyEngineError):
        return 503, "engine_unavailable"
    if isinstance(exc, UnknownStepError):
        return 404, "not_found"
    if isinstance(exc, SessionStateError):
        return 409, "session_state"
    if isinstance(exc, EngineTimeout):
        return 504, "engine_timeout"
    if isinstance(exc, EngineRequestError):
        return 400, "invalid_request_error"  # the engine refused what the request asked for
    if isinstance(exc, (EngineError, WireFormatError)):
        return 502, "engine_error"
    if isinstance(exc, FieldError):
        return 502, "engine_output_invalid"
    if isinstance(exc, TransferQueueError):
        return 503, "transfer_queue_unavailable"
    if isinstance(exc, (ConfigError, ChatTemplateError)):
        return 400, "invalid_request_error"
    if isinstance(exc, TrajectoryError):
        return 409, "session_state"
    return 500, "internal_error"


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def build_app(service: Any) -> FastAPI:
    app = FastAPI(title="Dressage Proxy", version="0.1.0")
    token = service.config.api_token
    limit = service.config.max_body_bytes

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if token is not None and request.url.path != "/health":
            header = request.headers.get("authorization", "")
            given = header[7:] if header.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(given.encode(), token.encode()):
                return JSONResponse(error_body("missing or wrong bearer token", "authentication_error"), 401)
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return JSONResponse(error_body(f"request body over {limit} bytes", "invalid_request_error"), 413)
        return await call_next(request)

    @app.exception_handler(DressageError)
    async def dressage_error(request: Request, exc: DressageError):
        service.failed_calls += 1
        status, kind = status_for(exc)
        # A 4xx here is final (a retry gets the same answer): tell OpenAI clients not to retry it.
        headers = {"x-should-retry": "false"} if status < 500 else None
        return JSONResponse(error_body(str(exc), kind, code=getattr(exc, "code", None) or type(exc).__name__),
                            status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            detail = (first.get("ctx") or {}).get("error", first.get("msg"))
            return JSONResponse(error_body(f"malformed JSON: {detail}", "invalid_request_error"), 400)
        if tuple(first.get("loc", ())) == ("body",):
            return JSONResponse(error_body("request body must be a JSON object", "invalid_request_error"), 400)
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        msg = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
                        for e in errors[:5])
        return JSONResponse(error_body(msg, "invalid_request_error", param=param), 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error"), exc.status_code)

    def base(request: Request) -> str:
        return str(request.base_url).rstrip("/")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "sessions": len(service.core.sessions), "weight_version": service.weight_version}

    @app.post("/sessions")
    async def create_session(request: Request, body: CreateSession | None = None) -> dict[str, Any]:
        s = service.core.create_session((body.metadata if body else None))
        return {"session_id": s.session_id, "base_url": service.session_url(base(request), s.session_id)}

    async def answer(session_id: str, request: Request, body: ChatRequest) -> Response:
        turn = identity_from_headers(request.headers).turn_id
        out = await service.open_chat(session_id, body, turn_id=turn)
        if isinstance(out, dict):
            return Response(json.dumps(out), media_type="application/json")
        return StreamingResponse(out, media_type="text/event-stream", headers={"cache-control": "no-cache"})

    @app.post("/sessions/{session_id}/v1/chat/completions")
    async def chat(session_id: str, request: Request, body: ChatRequest) -> Response:
        return await answer(session_id, request, body)

    @app.post("/v1/chat/completions")
    async def chat_by_headers(request: Request, body: ChatRequest) -> Response:
        sid = service.header_session(identity_from_headers(request.headers))
        return await answer(sid, request, body)

    @app.get("/v1/models")
    async def all_models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": service.config.served_model_name, "object": "model",
                                            "owned_by": "dressage"}]}

    @app.get("/sessions/{session_id}/v1/models")
    async def models(session_id: str) -> dict[str, Any]:
        service.core.session(session_id)
        return {"object": "list", "data": [{"id": service.config.served_model_name, "object": "model",
                                            "owned_by": "dressage"}]}

    @app.post("/sessions/{session_id}/generate")
    async def generate(session_id: str, body: GenerateRequest) -> dict[str, Any]:
        return await service.generate_tokens(session_id, body)

    @app.post("/sessions/{session_id}/finalize")
    async def finalize(session_id: str, body: FinalizeRequest | None = None) -> dict[str, Any]:
        done = await asyncio.to_thread(service.finalize, session_id, body.reward if body else None)
        return {"session_id": session_id, "segments": len(done.segments), "reward": done.reward}

    @app.post("/sessions/{session_id}/abort")
    async def abort(session_id: str) -> dict[str, Any]:
        released = service.core.abort(session_id)
        return {"session_id": session_id, "state": "aborted", "released_refs": released}

    @app.get("/sessions/{session_id}/segments")
    async def segments(session_id: str):
        s = service.core.session(session_id)
        done = service.finalized.get(session_id)
        if done is None:
            raise SessionStateError(f"session {session_id} is {s.state}; segments exist after finalize")
        # Serialise with the stdlib: token lists can be long and pydantic adds nothing here.
        payload = json.dumps([seg.to_summary() for seg in done.segments])
        return Response(payload, media_type="application/json")

    @app.post("/session/finalize")
    async def finalize_by_headers(request: Request, body: FinalizeSessionRequest | None = None) -> dict[str, Any]:
        sid = (body.session_id if body else None) or identity_from_headers(request.headers).session_id
        if not sid:
            raise MissingSessionIdError("give session_id in the body or an X-Session-Id header")
        done = await asyncio.to_thread(service.finalize, sid, body.reward if body else None)
        return {"session_id": sid, "segments": len(done.segments), "reward": done.reward}

    @app.post("/trajectory/read")
    async def trajectory_read(body: TrajectoryReadRequest | None = None) -> Response:
        body = body or TrajectoryReadRequest()
        wanted = list(body.session_ids or []) + ([body.session_id] if body.session_id else [])
        if body.instance_id is not None:
            wanted += [sid for sid, d in service.finalized.items()
                       if str(d.metadata.get("instance_id")) == body.instance_id and sid not in wanted]
        elif not wanted:
            wanted = list(service.finalized)
        out = []
        for sid in wanted:
            done = service.finalized.get(sid)
            if done is None:
                s = service.core.session(sid)  # 404 when unknown
                raise SessionStateError(f"session {sid} is {s.state}; its trajectory exists after finalize")
            out.append({"session_id": sid, "reward": done.reward, "metadata": done.metadata,
                        "segments": [seg.to_summary() for seg in done.segments]})
        if body.drain:
            service.forget(wanted)
        return Response(json.dumps({"trajectories": out, "drained": body.drain}), media_type="application/json")

    @app.get("/trajectory/stats")
    async def trajectory_stats() -> dict[str, Any]:
        return service.stats()

    @app.post("/v1/rollout/pause")
    async def rollout_pause() -> dict[str, Any]:
        return await service.pause.pause()

    @app.post("/v1/rollout/resume")
    async def rollout_resume(body: ResumeRequest | None = None) -> dict[str, Any]:
        return service.pause.resume(body.weight_version if body else None)

    @app.get("/v1/rollout/pause_state")
    async def rollout_pause_state() -> dict[str, Any]:
        return service.pause.state()

    @app.get("/v1/engines")
    async def engines() -> dict[str, Any]:
        return {"engines": service.engines.describe(), "moves": len(service.engines.moves)}

    @app.get("/sessions/{session_id}")
    async def session_info(session_id: str) -> dict[str, Any]:
        s = service.core.session(session_id)
        return {"session_id": s.session_id, "state": s.state, "steps": len(s.steps),
                "lineages": len({st.lineage_id for st in s.steps.values()}), "metadata": s.metadata}

    return app
