"""The routes upstream Dressage's clients call: finalize, discard, trajectory read / ack / release, TQ spec,
capabilities.

Bodies are strict (an unknown key is a 400: these calls change what is trained on); the session
may be named in the body or by the ``X-Session-Id`` / ``X-SMG-Routing-Key`` header. The use cases
are ``service.trajectories`` (:class:`dressage.proxy.upstream.trajectories.Trajectories`).
"""

from __future__ import annotations

import logging
from typing import Any

import msgpack
from fastapi import APIRouter, Request, Response
from starlette.background import BackgroundTask

from dressage.proxy import fastjson
from dressage.errors import AnswerEncodeError, DressageError, MissingSessionIdError, UnknownStepError
from dressage.proxy.http.capabilities import capabilities, template_fingerprint, upstream_capabilities
from dressage.trajectory.sample_wire import MSGPACK_MEDIA_TYPE
from dressage.proxy.schemas import (DiscardRequest, FinalizeRequest, FinalizeSessionRequest, TrajectoryAckRequest,
                                    TrajectoryReadRequest)
from dressage.proxy.recording.turns import identity_from_headers
from dressage.proxy.upstream.read import unknown_read_answer

__all__ = ["upstream_router", "accepts"]

log = logging.getLogger(__name__)


def _json(value: Any) -> Response:
    return Response(fastjson.dumps(value), media_type="application/json")


def accepts(accept: str, media_type: str) -> bool:
    """Whether an ``Accept`` header value names ``media_type`` with a quality above 0 (``q=0``: "not this")."""
    for part in accept.split(","):
        kind, *params = (p.strip() for p in part.split(";"))
        if kind.lower() != media_type:
            continue
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0  # a malformed weight is not an acceptance
        if quality > 0:
            return True
    return False


def _session(request: Request, given: str | None) -> str:
    sid = given or identity_from_headers(request.headers).session_id
    if not sid:
        raise MissingSessionIdError("give session_id in the body or an X-Session-Id header")
    return sid


def _encode_answer(answer: Any, binary: bool) -> bytes:
    """The read answer's body; :class:`AnswerEncodeError` when a value in it cannot be written."""
    try:
        if binary:
            return msgpack.packb(answer, use_bin_type=True)
        return fastjson.dumps(answer)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise AnswerEncodeError(f"the read answer cannot be encoded as {'msgpack' if binary else 'JSON'} "
                                f"({type(exc).__name__}: {str(exc)[:200]}); nothing was handed over, its "
                                "trajectories stay readable") from None


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

    @router.post("/sessions/{session_id}/discard")
    async def discard_by_path(session_id: str) -> dict[str, Any]:
        return service.trajectories.discard(session_id)

    @router.post("/trajectory/read")
    async def trajectory_read(request: Request, body: TrajectoryReadRequest | None = None) -> Response:
        body = body or TrajectoryReadRequest()
        # A reader that accepts msgpack gets the answer as msgpack, resident arrays as raw bytes.
        binary = accepts(request.headers.get("accept", ""), MSGPACK_MEDIA_TYPE)
        try:
            answer = service.trajectories.read(trajectory_id=body.trajectory_id, session_id=body.session_id,
                                               session_ids=body.session_ids, instance_id=body.instance_id,
                                               max_groups=body.max_groups, segment_view=body.segment_view,
                                               drain=body.drain, format=body.format, binary=binary,
                                               min_group_size=body.min_group_size,
                                               group_timeout_s=body.group_timeout_s,
                                               lease=body.lease, lease_s=body.lease_s)
        except UnknownStepError:
            # Upstream's client raises on any error status: a trajectory it does not hold (never
            # finalized here, or drained already) is a 200 with success false, as upstream answers.
            # Our trainer's Sample reads stay strict (a 404 names what is missing).
            if body.format == "samples":
                raise
            named = [s for s in (body.trajectory_id, body.session_id, *(body.session_ids or ())) if s]
            answer = unknown_read_answer(list(dict.fromkeys(named)), drained=body.drain, stats=service.stats())
        read_id = answer.get("read_id")
        try:
            content = _encode_answer(answer, binary)
        except AnswerEncodeError:
            if read_id is not None:
                service.trajectories.release(read_id)
            raise
        media = MSGPACK_MEDIA_TYPE if binary else "application/json"
        if body.drain and read_id is not None:
            # One call for upstream's clients, two phases here: forgotten once the answer is written whole.
            return Response(content, media_type=media, background=BackgroundTask(drained, read_id))
        return Response(content, media_type=media)

    async def drained(read_id: str) -> None:
        # On the loop, right after the last byte: a request that follows the answer sees it forgotten.
        try:
            service.trajectories.ack(read_id)
        except DressageError as exc:  # the lease stays: its trajectories are readable again once it expires
            log.warning("draining read %s was written but not forgotten: %s", read_id, exc)

    @router.post("/trajectory/ack")
    async def trajectory_ack(body: TrajectoryAckRequest) -> Response:
        return _json(service.trajectories.ack(body.read_id))

    @router.post("/trajectory/release")
    async def trajectory_release(body: TrajectoryAckRequest) -> Response:
        return _json(service.trajectories.release(body.read_id))

    @router.get("/transfer_queue/spec")
    async def transfer_queue_spec() -> Response:
        # The spec may carry the TQ's shared secret: an admin path, guarded like the read that also hands it out.
        return _json(service.trajectories.transfer_queue_spec())

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
