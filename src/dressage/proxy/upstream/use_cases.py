"""The session and trajectory use cases upstream Dressage's clients rely on, over a Proxy service.

``service`` is the Proxy's per-process state (``core``, ``finalized``, ``in_flight``, ``ledger``,
``forget``, ``stats``, ``config``); the HTTP routes only parse bodies and call these.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from dressage.errors import ConfigError, SessionStateError, UnknownStepError
from dressage.proxy.recording.lifecycle import count_turns
from dressage.trajectory.sample_wire import samples_wire
from dressage.proxy.upstream.read import read_answer, select_trajectories
from dressage.trajectory import build_segments

__all__ = ["finalize_session", "discard_session", "read_trajectories", "DEFAULT_FINALIZE_WAIT_S"]

DEFAULT_FINALIZE_WAIT_S = 30.0


def _answer(service: Any, sid: str, done: Any, session: Any, waited: bool) -> dict[str, Any]:
    meta = done.metadata
    return {"success": True, "session_id": sid, "trajectory_id": sid, "instance_id": meta.get("instance_id"),
            "label": meta.get("label"), "reward": done.reward, "num_steps": len(session.steps),
            "num_turns": count_turns(session.steps.values()), "num_segments": len(done.segments),
            "segments": len(done.segments), "in_flight_done": waited,
            "segment_view": service.core.config.segment_view}


async def finalize_session(service: Any, sid: str, *, reward: float | None = None, instance_id: str | None = None,
                           label: Any = None, wait_s: float | None = None) -> dict[str, Any]:
    """Finalize once: wait (bounded) for the session's calls in flight, record ``instance_id`` /
    ``label``, build Segments. A repeat, or a finalize that arrives while one runs, answers what
    the first finalize answered."""
    prior = service.ledger.get(sid)
    if prior is not None:
        return prior
    running = service.finalizing.get(sid)
    if running is not None:
        return await asyncio.shield(running)
    service.core.session(sid)  # 404 for an unknown session, 409 for an aborted one
    fut = service.finalizing[sid] = asyncio.get_running_loop().create_future()
    try:
        answer = await _finalize_once(service, sid, reward, instance_id, label, wait_s)
    except BaseException as exc:
        if isinstance(exc, Exception):
            fut.set_exception(exc)
            fut.exception()  # those who wait re-raise it; nobody else has to look
        else:
            fut.cancel()
        raise
    finally:
        service.finalizing.pop(sid, None)
    fut.set_result(answer)
    return answer


async def _finalize_once(service: Any, sid: str, reward: float | None, instance_id: str | None, label: Any,
                         wait_s: float | None) -> dict[str, Any]:
    limit = getattr(service.config, "finalize_wait_s", DEFAULT_FINALIZE_WAIT_S) if wait_s is None else wait_s
    waited = await service.in_flight.wait_idle(sid, limit)
    session = service.core.session(sid)
    done = service.finalized.get(sid)
    if session.state == "finalized" and done is not None:
        answer = _answer(service, sid, done, session, waited)  # finalized before a restart (journal)
        service.ledger.put(sid, answer)
        return answer
    if session.state == "active":
        if instance_id is not None:
            session.metadata["instance_id"] = str(instance_id)
            session.metadata["group_index"] = service.group_of(instance_id)
        if label is not None:
            session.metadata["label"] = label
    done = await asyncio.to_thread(service.finalize, sid, reward)
    answer = _answer(service, sid, done, service.core.session(sid), waited)
    service.ledger.put(sid, answer)
    return answer


def discard_session(service: Any, sid: str) -> dict[str, Any]:
    """Drop a session (active or finalized) and its TransferQueue keys; a repeat is a no-op."""
    out = service.core.discard(sid)
    service.finalized.pop(sid, None)
    service.ledger.drop(sid)
    service.forget_state(sid)
    return {"success": True, **out}


def read_trajectories(service: Any, *, trajectory_id: str | None = None, session_id: str | None = None,
                      session_ids: Sequence[str] | None = None, instance_id: str | None = None,
                      max_groups: int | None = None, segment_view: str | None = None,
                      drain: bool = False, format: str = "segments", binary: bool = False) -> dict[str, Any]:
    """``POST /trajectory/read`` in upstream's envelope (see :mod:`dressage.proxy.upstream.read`).

    A named trajectory that is not finalized is an error: 404 when unknown (or drained), 409 when
    still active or aborted. ``format="samples"`` answers, per trajectory, its Samples in wire form
    (large fields as FieldRefs when TQ is on) with the TQ client spec in ``meta_info``: what a
    trainer in another process needs (:mod:`dressage.train.remote`); ``binary`` gives resident arrays
    as bytes, for a msgpack answer.
    """
    selection = select_trajectories(service.finalized, trajectory_id=trajectory_id, session_id=session_id,
                                    session_ids=session_ids, instance_id=instance_id, max_groups=max_groups)
    for sid in selection.missing:
        state = service.core.state_of(sid)
        if state is None:
            raise UnknownStepError(f"unknown trajectory {sid!r} (never finalized here, or already drained)")
        raise SessionStateError(f"session {sid} is {state}; its trajectory exists after finalize")
    cfg = service.core.config
    segments_of = None
    if segment_view is not None and segment_view != cfg.segment_view:
        if format == "samples":
            raise ConfigError("segment_view: Samples are built with the Proxy's --segment-view at finalize; "
                              "read them without segment_view")
        if cfg.drop_retry_orphans:
            raise ConfigError("segment_view differs from the Proxy's --segment-view, and retry orphans were "
                              "dropped (their keys released) at finalize: read with the Proxy's view")

        def segments_of(done: Any) -> list[Any]:
            return build_segments(service.core.session(done.session_id), segment_view)
    if format == "samples":
        data = [{"session_id": sid, "reward": service.finalized[sid].reward,
                 "metadata": service.finalized[sid].metadata,
                 "samples": samples_wire(service.finalized[sid], binary=binary)}
                for sid in selection.session_ids]
        spec = service.tq_spec() if service.tq_spec is not None else None
        answer = {"success": bool(data), "mode": "samples", "data": data, "drained": bool(drain),
                  "meta_info": {"trajectories": len(data), "groups": len(selection.groups), "transfer_queue": spec,
                                "selection": selection.mode}}
    else:
        answer = read_answer(selection, service.finalized, drained=drain, stats=service.stats(),
                             segments_of=segments_of)
    if drain:
        service.forget(selection.session_ids)
    return answer
