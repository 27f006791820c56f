"""Pause and resume rollout around a weight update, cutting in-flight generations at a token boundary.

``pause()`` stops new engine calls and aborts the running ones through the engine's
``/abort_request``; each comes back with its partial output. ``resume(version)`` sets the new
policy version and lets the waiting calls continue from where they were cut. A pause may be
global or scoped to a session or a prompt instance: only that scope's calls are cut and held
(waiting, like a global pause's), every other call runs on.

Versions themselves are :class:`dressage.proxy.recording.weights.WeightVersions`' (``self.versions``):
the engine's ``meta_info.weight_version`` stamps tokens, resume's number is the fallback.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from dressage.errors import EngineError, SessionStateError
from dressage.proxy.recording.weights import UNSET_ENGINE_VERSION, WeightVersions

__all__ = ["RolloutPause", "UNSET_ENGINE_VERSION", "ABORT_CALL_TIMEOUT_S"]

ABORT_CALL_TIMEOUT_S = 5.0
"""How long one ``/abort_request`` may take: an engine that is gone must not hold the pause."""


@dataclass(slots=True)
class _Running:
    client: Any
    done: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: bool = False
    session_id: str | None = None
    instance_id: str | None = None


class RolloutPause:
    """Pause state shared by every call of one Proxy (all methods run on the server's loop)."""

    def __init__(self, versions: WeightVersions | int | str = 0, *, abort_timeout_s: float = 30.0,
                 abort_retry_s: float = 0.05) -> None:
        self.versions = versions if isinstance(versions, WeightVersions) else WeightVersions(versions)
        self.paused = False
        self.paused_at: float | None = None
        self.pauses = 0
        self.paused_s = 0.0
        """Seconds spent under a global pause that ended (``dressage_paused_seconds_total`` adds the current one)."""
        self.aborted_total = 0
        self.abort_timeout_s = float(abort_timeout_s)
        self.abort_retry_s = float(abort_retry_s)
        self._running: dict[str, _Running] = {}
        self._resumed: asyncio.Event | None = None
        self.scopes: set[tuple[str, str]] = set()
        """Paused sessions and instances (``("session", id)`` / ``("instance", id)``) besides a global pause."""
        self._ended: dict[str, str] = {}
        """Sessions that ended (finalized, aborted, discarded) while a pause held calls: session id -> state."""

    def _event(self) -> asyncio.Event:
        # Created on first use, so it belongs to the server's loop rather than the constructor's.
        if self._resumed is None:
            self._resumed = asyncio.Event()
            if not self.paused:
                self._resumed.set()
        return self._resumed

    def blocked(self, session_id: str | None = None, instance_id: str | None = None) -> bool:
        """Whether a call of this session / instance must wait."""
        return self.paused or (session_id is not None and ("session", session_id) in self.scopes) \
            or (instance_id is not None and ("instance", str(instance_id)) in self.scopes)

    async def wait_running(self, timeout: float | None = None, *, session_id: str | None = None,
                           instance_id: str | None = None) -> bool:
        """Return at once unless paused (globally or for this session / instance); otherwise when
        resumed (True) or after ``timeout`` (False)."""
        while self.blocked(session_id, instance_id):
            ended = self._ended.get(session_id) if session_id is not None else None
            if ended is not None:  # it can record nothing more: no need to wait for the weights
                raise SessionStateError(f"session {session_id} is {ended}")
            try:
                await asyncio.wait_for(self._event().wait(), timeout)
            except asyncio.TimeoutError:
                return False
        return True

    def end_session(self, session_id: str, state: str) -> None:
        """The session ended (``state``: finalized, aborted, discarded): its calls a pause holds fail now, as
        they would at resume, rather than keep their connections for as long as the weight update takes."""
        if not (self.paused or self.scopes):
            return
        self._ended[session_id] = state
        held = self._event()
        if not held.is_set():  # wake the waiters, who wait again on a fresh event unless theirs ended
            self._resumed = asyncio.Event()
            held.set()

    @asynccontextmanager
    async def track(self, rid: str, client: Any, *, session_id: str | None = None,
                    instance_id: str | None = None) -> AsyncIterator[_Running]:
        """Register one engine request for the duration of the call, so a pause can abort it."""
        run = self._running[rid] = _Running(client, session_id=session_id,
                                            instance_id=None if instance_id is None else str(instance_id))
        try:
            yield run
        finally:
            run.done.set()
            self._running.pop(rid, None)

    async def pause(self, *, session_id: str | None = None, instance_id: str | None = None,
                    timeout_s: float | None = None) -> dict[str, Any]:
        """Stop new calls, abort running ones and wait until each has answered with its partial output.

        With ``session_id`` or ``instance_id`` only that session's (instance's) calls are paused
        and cut; everything else keeps running. An abort can reach the engine before the request
        it targets; it is re-sent until that request answers, so no generation keeps running on
        the old weights.
        """
        scoped = session_id is not None or instance_id is not None
        if scoped:
            if session_id is not None:
                self.scopes.add(("session", session_id))
            if instance_id is not None:
                self.scopes.add(("instance", str(instance_id)))
            self.pauses += 1
            self._event().clear()
        elif not self.paused:
            self.paused, self.paused_at, self.pauses = True, time.time(), self.pauses + 1
            self._event().clear()
        targets = {rid: r for rid, r in self._running.items()
                   if not scoped or (session_id is not None and r.session_id == session_id)
                   or (instance_id is not None and r.instance_id == str(instance_id))}
        for run in targets.values():
            run.aborted = True
        deadline = asyncio.get_running_loop().time() + (self.abort_timeout_s if timeout_s is None else timeout_s)
        pending = {rid: r for rid, r in targets.items() if not r.done.is_set()}
        unreachable: dict[str, str] = {}
        while pending and asyncio.get_running_loop().time() < deadline:
            await asyncio.gather(*(self._abort(rid, r, unreachable) for rid, r in pending.items()))
            waits = [asyncio.ensure_future(r.done.wait()) for r in pending.values()]
            await asyncio.wait(waits, timeout=self.abort_retry_s * 4)
            for w in waits:
                w.cancel()
            pending = {rid: r for rid, r in pending.items() if not r.done.is_set()}
        self.aborted_total += len(targets)
        out = {"paused": True, "aborted": len(targets), "still_running": len(pending),
               "weight_version": self.versions.current, "version": self.versions.label}
        if unreachable:
            out["engines_unreachable"] = unreachable
        if scoped:
            out["scope"] = {"session_id": session_id, "instance_id": instance_id}
        return out

    async def _abort(self, rid: str, run: _Running, unreachable: dict[str, str]) -> None:
        try:
            await asyncio.wait_for(run.client.abort(rid), ABORT_CALL_TIMEOUT_S)
        except (EngineError, asyncio.TimeoutError) as exc:
            # The engine is gone: its request fails on its own and is not recorded; the answer names it.
            why = str(exc) or f"no answer to /abort_request within {ABORT_CALL_TIMEOUT_S} s"
            unreachable[str(getattr(run.client, "base_url", "engine"))] = why

    @property
    def weight_version(self) -> int:
        """The current token version (:attr:`WeightVersions.current`)."""
        return self.versions.current

    def resume(self, weight_version: int | str | None = None) -> dict[str, Any]:
        """Set the new policy version (if given: a number or the engine's string) and release
        every waiting call (global and scoped pauses alike)."""
        if weight_version is not None:
            self.versions.set(weight_version)
        was = self.paused or bool(self.scopes)
        if self.paused_at is not None:
            self.paused_s += max(time.time() - self.paused_at, 0.0)
        self.paused, self.paused_at = False, None
        self.scopes.clear()
        self._ended.clear()
        self._event().set()
        return {"paused": False, "resumed": was, "weight_version": self.versions.current,
                "version": self.versions.label}

    def state(self) -> dict[str, Any]:
        return {"paused": self.paused, "paused_at": self.paused_at, **self.versions.state(),
                "in_flight": len(self._running), "pauses": self.pauses, "aborted_total": self.aborted_total,
                "paused_scopes": sorted(f"{kind}:{key}" for kind, key in self.scopes)}
