"""The routes upstream Dressage's clients call: finalize, discard, trajectory read, capabilities.

Bodies are strict (an unknown key is a 400: these calls change what is trained on); the session
may be named in the body or by the ``X-Session-Id`` / ``X-SMG-Routing-Key`` header. The use cases
are ``service.trajectories`` (:class:`dressage.proxy.upstream.trajectories.Trajectories`).
"""

from __future__ import annotations

from typing import Any

import msgpack
from fastapi import APIRouter, Request, Response

from dressage.proxy import fastjson
from dressage.errors import MissingSessionIdError, UnknownStepError
from dressage.proxy.http.capabilities import capabilities, template_fingerprint, upstream_capabilities
from dressage.trajectory.sample_wire import MSGPACK_MEDIA_TYPE
from dressage.proxy.schemas import DiscardRequest, FinalizeRequest, FinalizeSessionRequest, TrajectoryReadRequest
from dressage.proxy.recording.turns import identity_from_headers
from dressage.proxy.upstream.read import unknown_read_answer

__all__ = ["upstream_router"]


def _json(value: Any) -> Response:
    return Response(fastjson.dumps(value), media_type="application/json")


def _session(request: Request, given: str | None) -> str:
    sid = given or identity_from_headers(request.headers).session_id
    if not sid:
        raise MissingSessionIdError("give session_id in the body or an X-Session-Id header")
    return sid


def upstream_router(service: Any) -> APIRouter:
    """The routes over ``service`` (a :class:`dressage.proxy.service.ProxyService`)."""
    router = APIRouter()

    async def finalize(sid: str, body: FinalizeRequest | None) -> dict[str, Any]:
        body = body or FinalizeRequest()
        return await service.trajectories.finalize_session(sid, reward=body.reward, instance_id=body.instance_id,
                                                           label=body.label, wait_s=body.wait_s)

    @router.post("/session/finalize")
    async def finalize_by_body(request: Request, body: FinalizeSessionRequest | None = None) -> dict[str, Any]:
        return await finalize(_session(request, body.session_id if body else None), body)

    @router.post("/sessions/{session_id}/finalize")
    async def finalize_by_path(session_id: str, body: FinalizeRequest | None = None) -> dict[str, Any]:
        return await finalize(session_id, body)

    @router.post("/session/discard")
    async def discard(request: Request, body: DiscardRequest | None = None) -> dict[str, Any]:
        return service.trajectories.discard(_session(request, body.session_id if body else None))

    @router.post("/trajectory/read")
    async def trajectory_read(request: Request, body: TrajectoryReadRequest | None = None) -> Response:
        body = body or TrajectoryReadRequest()
        # A reader that accepts msgpack gets the answer as msgpack, resident arrays as raw bytes.
        binary = MSGPACK_MEDIA_TYPE in request.headers.get("accept", "")
        try:
            answer = service.trajectories.read(trajectory_id=body.trajectory_id, session_id=body.session_id,
                                               session_ids=body.session_ids, instance_id=body.instance_id,
                                               max_groups=body.max_groups, segment_view=body.segment_view,
                                               drain=body.drain, format=body.format, binary=binary,
                                               min_group_size=body.min_group_size,
                                               group_timeout_s=body.group_timeout_s)
        except UnknownStepError:
            # Upstream's client raises on any error status: a trajectory it does not hold (never
            # finalized here, or drained already) is a 200 with success false, as upstream answers.
            # Our trainer's Sample reads stay strict (a 404 names what is missing).
            if body.format == "samples":
                raise
            named = [s for s in (body.trajectory_id, body.session_id, *(body.session_ids or ())) if s]
            answer = unknown_read_answer(list(dict.fromkeys(named)), drained=body.drain, stats=service.stats())
        if binary:
            return Response(msgpack.packb(answer, use_bin_type=True), media_type=MSGPACK_MEDIA_TYPE)
        return _json(answer)

    @router.get("/integration/capabilities")
    async def integration_capabilities() -> dict[str, Any]:
        cfg, dp = service.config, service.core.config
        ours = capabilities(partial_rollout=cfg.sessions.partial_rollout,
                            rollout_routing_replay=dp.use_rollout_routing_replay,
                            transfer_queue=dp.enable_transfer_queue, segment_view=dp.segment_view,
                            engines=len(service.engines.members), router=service.router,
                            model={"name": dp.model.name, "num_layers": dp.model.num_layers, "topk": dp.model.topk,
                                   "num_experts": dp.model.num_experts,
                                   "routed_experts_dtype": dp.routed_experts_dtype,
                                   "served_model_name": cfg.server.served_model_name},
                            finalize_wait_s=cfg.sessions.finalize_wait_s)
        return upstream_capabilities(ours, tokenizer=cfg.tokenizer, token_build_model=cfg.token_build.family,
                                     max_output_tokens=cfg.limits.max_output_tokens,
                                     partial_rollout=cfg.sessions.partial_rollout,
                                     max_partial_rollout_preempts=cfg.sessions.max_partial_rollout_preempts,
                                     record_token_versions=cfg.reads.record_token_versions,
                                     mask_nonlast_version_tokens=cfg.reads.mask_nonlast_version_tokens,
                                     weight_version=service.versions.label,
                                     chat_template_fingerprint=template_fingerprint(service.tokenizer))

    return router
