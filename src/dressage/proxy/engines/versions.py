"""The engines' own weight versions: read them for ``GET /v1/engines``, set them before a resume.

Each engine of the pool is asked directly (``GET /get_weight_version``,
``POST /update_weight_version``); an engine behind a router in ``data_path`` mode is asked on every
healthy HTTP worker the router lists (:meth:`RouterClient.targets`), since the router does not
forward these calls reliably. A read never fails as a whole: an engine or worker that does not
answer gets an error string in its entry. An update never waits on an engine that is gone: one
that cannot be reached (or is known down and fails a quick probe) is reported ``unreachable``,
taken out of placement and set when it comes back (:meth:`EnginePool.check`); an engine that
answers and refuses fails the update with a 502 naming the ones that failed and the ones updated.
"""

from __future__ import annotations

import asyncio
from typing import Any

from dataclasses import dataclass, field

from dressage.errors import DressageError, EngineTimeout, EngineUnavailable, EngineUpdateError
from dressage.proxy.engines.pool import EnginePool

__all__ = ["read_versions", "update_versions", "VersionUpdate", "READ_TIMEOUT_S", "UPDATE_TIMEOUT_S",
           "PROBE_TIMEOUT_S"]

READ_TIMEOUT_S = 5.0
"""How long ``GET /v1/engines`` waits for one engine's version."""
UPDATE_TIMEOUT_S = 30.0
"""How long a resume waits for one engine to take the new version."""
PROBE_TIMEOUT_S = 2.0
"""How long a resume probes an engine already known to be down before it reports it unreachable."""


@dataclass(slots=True)
class VersionUpdate:
    """What an update reached: the engines (workers) updated, and those gone, with why."""

    updated: list[str] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, DressageError) else f"{type(exc).__name__}: {exc}"


async def _endpoints(url: str, client: Any, timeout: float) -> list[tuple[str, Any]]:
    """``(url, client)`` of what takes the version calls: the router's healthy workers, or the engine."""
    if getattr(client, "is_router", False):
        return [(w.url, client.worker(w.url)) for w in await client.targets(timeout)]
    return [(url, client)]


async def _engine_version(url: str, client: Any, timeout: float) -> dict[str, Any]:
    """One pool member's version entry (``weight_version`` or ``weight_version_error``; ``workers`` for a router)."""
    if not hasattr(client, "get_weight_version"):
        return {"weight_version": None, "weight_version_error": "this engine client cannot read a weight version"}
    try:
        ends = await _endpoints(url, client, timeout)
    except DressageError as exc:
        return {"weight_version": None, "weight_version_error": f"workers list: {exc}"}
    answers = await asyncio.gather(*(c.get_weight_version(timeout) for _, c in ends), return_exceptions=True)
    entries = [{"url": u, "weight_version": a} if isinstance(a, str) else
               {"url": u, "weight_version": None, "weight_version_error": _reason(a)}
               for (u, _), a in zip(ends, answers)]
    for a in answers:
        if isinstance(a, BaseException) and not isinstance(a, Exception):
            raise a  # cancellation is not an engine's answer
    out: dict[str, Any] = {}
    if getattr(client, "is_router", False):
        out["workers"] = entries
    errors = [f"{e['url']}: {e['weight_version_error']}" for e in entries if "weight_version_error" in e]
    distinct = sorted({e["weight_version"] for e in entries if e["weight_version"] is not None})
    if not entries:
        errors.append("the router lists no healthy HTTP worker")
    elif len(distinct) > 1:
        errors.append(f"the workers run different weight versions: {', '.join(distinct)}")
    out["weight_version"] = distinct[0] if len(distinct) == 1 and not errors else None
    if errors:
        out["weight_version_error"] = "; ".join(errors)
    return out


async def read_versions(pool: EnginePool, timeout: float = READ_TIMEOUT_S) -> dict[str, dict[str, Any]]:
    """``{engine url: version entry}`` for every engine of ``pool``; never raises for an engine's failure."""
    members = list(pool.members.values())
    entries = await asyncio.gather(*(_engine_version(m.url, m.client, timeout) for m in members))
    return {m.url: e for m, e in zip(members, entries)}


async def update_versions(pool: EnginePool, version: str, timeout: float = UPDATE_TIMEOUT_S) -> VersionUpdate:
    """Set ``version`` on every engine (every healthy worker behind a ``data_path`` router).

    Engines that cannot be reached are reported in :attr:`VersionUpdate.unreachable` (and marked
    ``version_behind`` in the pool). Raises :class:`EngineUpdateError` (502) naming each engine or worker
    that answered and failed, with the ones updated in its message and ``details`` (``updated``,
    ``failed``, ``unreachable``).
    """
    failed: dict[str, str] = {}
    result = VersionUpdate()
    targets: list[tuple[str, Any, Any]] = []
    members = pool.control_targets()
    known_down = [m for m in members if not m.healthy or not m.router_healthy]
    probes = await asyncio.gather(*(m.client.health(timeout=PROBE_TIMEOUT_S) for m in known_down),
                                  return_exceptions=True)
    down = {m.url for m, ok in zip(known_down, probes) if ok is not True}
    for m in members:
        if m.url in down:
            m.healthy, m.version_behind = False, version
            result.unreachable[m.url] = "down (failed its health probe)"
            continue
        if not hasattr(m.client, "update_weight_version"):
            failed[m.url] = "this engine client cannot set a weight version"
            continue
        try:
            ends = await _endpoints(m.url, m.client, timeout)
        except DressageError as exc:
            failed[m.url] = f"workers list: {exc}"
            continue
        if not ends:
            failed[m.url] = "the router lists no healthy HTTP worker"
        targets += [(u, c, m) for u, c in ends]
    results = await asyncio.gather(*(c.update_weight_version(version, timeout=timeout) for _, c, _ in targets),
                                   return_exceptions=True)
    for (url, _, member), r in zip(targets, results):
        if isinstance(r, BaseException) and not isinstance(r, Exception):
            raise r
        if isinstance(r, (EngineUnavailable, EngineTimeout)):
            result.unreachable[url] = _reason(r)
            if member.url == url:  # a pool member itself (not a worker behind a data-path router)
                member.healthy, member.version_behind = False, version
        elif isinstance(r, Exception):
            failed[url] = _reason(r)
        elif isinstance(r, dict) and r.get("success") is False:
            failed[url] = f"the engine refused: {r.get('message', r)}"
        else:
            result.updated.append(url)
            if member.url == url:
                member.version_behind = None
    if not result.updated and not failed:
        failed.update(result.unreachable)  # nothing took the version: the rollout cannot go on
    if failed:
        err = EngineUpdateError(f"weight version {version!r} was not set on every engine; failed: "
                                + "; ".join(f"{u}: {why}" for u, why in failed.items())
                                + f"; updated: {', '.join(result.updated) or 'none'}; the Proxy stays paused",
                                for_operator=True)
        err.param = "update_engines"
        err.details = {"version": version, "updated": result.updated, "failed": failed,
                       "unreachable": result.unreachable}
        raise err
    return result
