"""Rollout control routes: pause (all calls, a session's or an instance's), resume, pause state.

A trainer calls these around a weight update. They change what tokens are recorded with, so
their bodies are strict (an unknown key is a 400). :func:`rollout_router` returns an
``APIRouter`` over a Proxy service; an app can guard the whole router (``dependencies=``).
"""

from __future__ import annotations

from typing import Any, Sequence

from fastapi import APIRouter

from dressage.errors import ConfigError
from dressage.proxy.schemas import PauseRequest, ResumeRequest

__all__ = ["rollout_router"]


def rollout_router(service: Any, *, dependencies: Sequence[Any] = ()) -> APIRouter:
    """``POST /v1/rollout/pause``, ``POST /v1/rollout/resume``, ``GET /v1/rollout/pause_state``."""
    router = APIRouter(prefix="/v1/rollout", dependencies=list(dependencies))

    @router.post("/pause")
    async def rollout_pause(body: PauseRequest | None = None) -> dict[str, Any]:
        body = body or PauseRequest()
        instance = None if body.instance_id is None else str(body.instance_id)
        out = await service.pause_rollout(session_id=body.session_id, instance_id=instance,
                                          timeout_s=body.timeout_seconds)
        if body.reason is not None:
            out["reason"] = body.reason
        return out

    @router.post("/resume")
    async def rollout_resume(body: ResumeRequest | None = None) -> dict[str, Any]:
        try:
            version = body.requested() if body else None
        except ValueError as exc:
            raise ConfigError(f"resume: {exc}") from None
        if body is not None and body.update_engines:
            out = await service.resume_updating_engines(version)
        else:
            out = service.resume_rollout(version)
        if body is not None and body.reason is not None:
            out["reason"] = body.reason
        return out

    @router.get("/pause_state")
    async def rollout_pause_state() -> dict[str, Any]:
        return service.pause_state()

    return router
