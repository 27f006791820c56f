"""The session viewer's admin routes: the live page and the JSON documents it polls.

``GET /admin/viewer`` answers the page; ``GET /admin/sessions`` lists the sessions the Proxy holds
with their state; ``GET /admin/sessions/{id}`` answers one as a session document (its step tree
and, once finalized, its Segments). All are admin paths (``/admin/`` in the guard's prefixes).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from dressage.proxy import fastjson
from dressage.proxy.http.viewer_page import render_viewer
from dressage.trajectory.view import TokenText, session_document

__all__ = ["viewer_router", "sessions_overview", "session_view"]


def sessions_overview(service: Any) -> dict[str, Any]:
    """Every session the Proxy holds, in creation order: id, state, steps, Segments once finalized."""
    finalized = service.trajectories.finalized
    rows = []
    for sid, s in list(service.core.sessions.items()):
        done = finalized.get(sid)
        rows.append({"session_id": sid, "state": s.state, "steps": len(s.steps),
                     "segments": None if done is None else len(done.segments),
                     "reward": s.reward})
    return {"sessions": rows}


def session_view(service: Any, session_id: str, token_text: Any = None) -> dict[str, Any]:
    """One session as :func:`~dressage.trajectory.view.session_document` (404 when unknown)."""
    session = service.core.session(session_id)
    done = service.trajectories.finalized.get(session_id)
    return session_document(session, None if done is None else done.segments,
                            reward=None if done is None else done.reward, token_text=token_text)


def viewer_router(service: Any) -> APIRouter:
    router = APIRouter(prefix="/admin")
    token_text = TokenText(getattr(getattr(service, "tokenizer", None), "decode", None))

    @router.get("/viewer")
    async def viewer() -> HTMLResponse:
        return HTMLResponse(render_viewer(None, title="Dressage sessions (live)"))

    @router.get("/sessions")
    async def sessions() -> Response:
        return Response(fastjson.dumps(sessions_overview(service)), media_type="application/json")

    @router.get("/sessions/{session_id}")
    async def session(session_id: str) -> Response:
        return Response(fastjson.dumps(session_view(service, session_id, token_text)), media_type="application/json")

    return router
