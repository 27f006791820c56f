"""The Proxy service: every use case of the Proxy, with no HTTP in it.

:class:`ProxyService` owns the per-process state (ProxyCore, tokenizer, engine pool, pause state,
turns, finalized trajectories) and answers each endpoint's question as plain values or a
:class:`dressage.errors.DressageError`; :mod:`dressage.proxy.http.app` only maps them to HTTP. The
model-call use cases (chat, token-level generate) are in :class:`dressage.proxy.openai.chat.serving.CallPath`,
Responses in :class:`~dressage.proxy.openai.responses.serving.ResponsesPath`, text completions and the model
lookup in :class:`~dressage.proxy.openai.completions.CompletionsPath`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterable

from dressage.errors import ConfigError, MissingSessionIdError, SessionStateError
from dressage.proxy.openai.chat.serving import CallPath
from dressage.proxy.openai.chat.prompt import QwenToolCallParser, ToolCallParser
from dressage.proxy.openai.completions import CompletionsPath
from dressage.proxy.config import ProxyConfig
from dressage.proxy.recording.core import FinalizedSession, ProxyCore
from dressage.proxy.engines.pool import EnginePool
from dressage.proxy.engines.versions import read_versions, update_versions
from dressage.proxy.recording.heap import trim_heap
from dressage.proxy.recording.lifecycle import FinalizeLedger, InFlight
from dressage.proxy.recording.limits import CallLimits
from dressage.proxy.recording.pause import RolloutPause
from dressage.proxy.openai.responses.protocol import ResponseMemory
from dressage.proxy.openai.responses.serving import ResponsesPath
from dressage.proxy.engines.rids import RidFactory
from dressage.proxy.recording.session_caps import SessionKeeper
from dressage.proxy.engines.startup import engine_clients
from dressage.proxy.recording.turns import CallIdentity, TurnCache, checked_identity, instance_group
from dressage.proxy.recording.weights import WeightVersions

__all__ = ["ProxyService"]


class ProxyService(CallPath, ResponsesPath, CompletionsPath):
    """Per-process state behind the HTTP module, and every use case of the Proxy.

    ``engine`` is an :class:`SGLangClient`, a list of them, an :class:`EnginePool`, or ``None``
    (clients for ``config.engines.urls`` are made here: :func:`dressage.proxy.engines.startup.engine_clients`).
    """

    def __init__(self, config: ProxyConfig, core: ProxyCore, tokenizer: Any, engine: Any = None,
                 *, parser: ToolCallParser | None = None) -> None:
        self.config, self.core, self.tokenizer = config, core, tokenizer
        self.tq_spec: Any = None  # () -> TQ client spec, set by Proxy.start when it has a deployment
        if isinstance(engine, EnginePool):
            self.engines = engine
        else:
            clients = engine if isinstance(engine, (list, tuple)) else [engine] if engine is not None else \
                engine_clients(config.engines)
            self.engines = EnginePool(clients, failures_to_remove=config.engines.health_check_failures)
        self.engine = next(iter(self.engines.members.values())).client
        self.parser = parser or QwenToolCallParser()
        self.versions = WeightVersions(partial_rollout=config.sessions.partial_rollout)
        self.pause = RolloutPause(self.versions)
        self.turns = TurnCache(config.sessions.max_cached_turns)
        self.responses = ResponseMemory()
        self.finalized: dict[str, FinalizedSession] = {}
        self.calls = self.failed_calls = self.replayed_turns = 0
        self.heap_trims, self.heap_trim_s = 0, 0.0
        """Trims after forgetting a batch of sessions, and the time they took."""
        self.limits = CallLimits(config.limits)
        self.rids = RidFactory()
        """Engine rids: one length and shape, so SGLang's abort by rid prefix hits only the call meant."""
        self.in_flight = InFlight()
        """Model calls running per session (finalize waits for them)."""
        self.ledger = FinalizeLedger()
        """Answers of finalizes, so that a repeat answers the same."""
        self.finalizing: dict[str, asyncio.Future] = {}
        """Finalizes under way (a concurrent repeat waits for the same answer)."""
        self.keeper = SessionKeeper(core, timeout_s=config.sessions.session_timeout_s,
                                    max_sessions=config.sessions.max_sessions,
                                    busy=self.in_flight.running, on_evict=self.forget_state)
        """Idle eviction and the cap on live sessions."""
        self._fresh: set[str] = set()
        """Sessions a header call created whose first call has not recorded yet (dropped if it fails)."""
        self._tasks: set[asyncio.Task] = set()

    @property
    def weight_version(self) -> int:
        """The policy version new tokens are recorded with when the engine reports none."""
        return self.versions.current

    @weight_version.setter
    def weight_version(self, value: int | str) -> None:
        self.versions.set(value)

    @property
    def router(self) -> bool:
        """Whether the engine is a router whose workers take the control calls."""
        return bool(getattr(self.engine, "is_router", False))

    def group_of(self, instance_id: Any) -> int:
        """The integer prompt-group index of ``instance_id``."""
        return instance_group(instance_id)

    def session_url(self, base: str, session_id: str) -> str:
        return f"{base.rstrip('/')}/sessions/{session_id}/v1"

    def header_session(self, ident: CallIdentity) -> str:
        """The session a header-identified call belongs to, created by its first call."""
        if not ident.session_id:
            raise MissingSessionIdError("send the session in an X-Session-Id (or X-SMG-Routing-Key) header, "
                                        "or use a session's base URL /sessions/{id}/v1")
        sid = checked_identity(ident).session_id
        if sid not in self.core.sessions:
            meta: dict[str, Any] = {"session_source": "headers"}
            if ident.instance_id is not None:
                meta.update(instance_id=ident.instance_id, group_index=self.group_of(ident.instance_id))
            self.keeper.admit()
            try:
                self.core.create_session(meta, session_id=sid)
            except SessionStateError:
                return sid  # a concurrent first call created it
            self.keeper.touch(sid)
            self._fresh.add(sid)
        return sid

    def drop_if_unused(self, session_id: str, *, own_calls: int = 0) -> None:
        """A header-created session whose first call failed is dropped: a failed call leaves nothing.

        ``own_calls``: calls of the caller itself still counted in flight (no other may be running).
        """
        if session_id in self._fresh and self.in_flight.running(session_id) <= own_calls:
            self._fresh.discard(session_id)
            if self.core.drop_unused(session_id):
                self.forget_state(session_id)

    # ---------------------------------------------------------- sessions
    def health(self) -> dict[str, Any]:
        return {"status": "ok", "sessions": len(self.core.sessions), "weight_version": self.weight_version}

    def create_session(self, metadata: dict[str, Any] | None, base_url: str) -> dict[str, Any]:
        self.keeper.admit()
        s = self.core.create_session(metadata)
        self.keeper.touch(s.session_id)
        return {"session_id": s.session_id, "base_url": self.session_url(base_url, s.session_id)}

    def session_info(self, session_id: str) -> dict[str, Any]:
        s = self.core.session(session_id)
        return {"session_id": s.session_id, "state": s.state, "steps": len(s.steps),
                "lineages": len({st.lineage_id for st in s.steps.values()}), "metadata": s.metadata}

    def models(self, session_id: str | None = None) -> dict[str, Any]:
        """``/v1/models``: the one served model (a session's base URL checks the session exists)."""
        if session_id is not None:
            self.core.session(session_id)
        return {"object": "list", "data": [{"id": self.config.server.served_model_name, "object": "model",
                                            "owned_by": "dressage"}]}

    # --------------------------------------------------------- lifecycle
    def finalize(self, session_id: str, reward: float | None) -> FinalizedSession:
        done = self.core.finalize(session_id, reward)
        self.keeper.release(session_id)
        self.finalized[session_id] = done
        return done

    def abort(self, session_id: str) -> dict[str, Any]:
        """Abort a session: its TQ keys are deleted, nothing more may be recorded, it leaves memory."""
        released = self.core.abort(session_id)
        self.finalized.pop(session_id, None)
        self.forget_state(session_id)
        return {"session_id": session_id, "state": "aborted", "released_refs": released}

    def _finalized(self, session_id: str, what: str) -> FinalizedSession:
        done = self.finalized.get(session_id)
        if done is None:
            s = self.core.session(session_id)  # 404 when unknown
            raise SessionStateError(f"session {session_id} is {s.state}; {what} after finalize")
        return done

    def segments(self, session_id: str) -> list[dict[str, Any]]:
        """Summaries of a finalized session's Segments."""
        return [seg.to_summary() for seg in self._finalized(session_id, "segments exist").segments]

    def forget(self, session_ids: Iterable[str]) -> None:
        """Drop finished sessions once their Samples were consumed.

        The heap pages they freed are then handed back to the OS (:func:`trim_heap`), so that what
        a batch left behind does not stay mapped as free heap into the next.
        """
        forgotten = 0
        for sid in list(session_ids):
            self.finalized.pop(sid, None)
            self.core.forget(sid)
            self.forget_state(sid)
            forgotten += 1
        if forgotten:
            self.heap_trim_s += trim_heap()
            self.heap_trims += 1

    def forget_state(self, session_id: str) -> None:
        """Drop what the call path keeps per session (engine placement, turns, responses, weight versions,
        idle clock)."""
        self.engines.forget(session_id)
        self.turns.forget_session(session_id)
        self.responses.forget(session_id)
        self.versions.forget(session_id)
        self.keeper.release(session_id)
        self._fresh.discard(session_id)

    def stats(self) -> dict[str, Any]:
        """Counters for ``GET /trajectory/stats``."""
        states: dict[str, int] = {"active": 0, "finalized": 0, "aborted": 0}
        steps = tokens = 0
        for s in list(self.core.sessions.values()):
            states[s.state] = states.get(s.state, 0) + 1
            steps += len(s.steps)
            tokens += sum(st.response_len for st in s.steps.values())
        return {"sessions": states, "steps": steps, "response_tokens": tokens,
                "unread_trajectories": len(self.finalized),
                "unread_segments": sum(len(d.segments) for d in self.finalized.values()),
                "calls": self.calls, "failed_calls": self.failed_calls, "replayed_turns": self.replayed_turns,
                "weight_version": self.weight_version, "pause": self.pause.state(),
                "engines": self.engines.describe(), "engine_moves": len(self.engines.moves),
                "evicted_sessions": self.keeper.evicted,
                "heap_trims": self.heap_trims, "heap_trim_ms": round(self.heap_trim_s * 1e3, 3),
                "tokenizer_cpu_s": round(float(getattr(self.tokenizer, "cpu_s", 0.0)), 6)}

    # ----------------------------------------------------- rollout, engines
    async def pause_rollout(self, *, session_id: str | None = None, instance_id: str | None = None,
                            timeout_s: float | None = None) -> dict[str, Any]:
        """Pause every call, or only a session's / a prompt instance's (see :class:`RolloutPause`)."""
        return await self.pause.pause(session_id=session_id, instance_id=instance_id, timeout_s=timeout_s)

    def resume_rollout(self, version: int | str | None) -> dict[str, Any]:
        """Release every paused call; ``version`` (a number or the engine's string) is the new fallback."""
        return self.pause.resume(version)

    async def resume_updating_engines(self, version: int | str | None) -> dict[str, Any]:
        """Set ``version`` on every engine (each worker behind a router), then resume; when an engine
        fails, a 502 names it and the ones updated, and the Proxy stays as it was (paused)."""
        if version is None:
            raise ConfigError("resume: update_engines needs a weight_version or version to set")
        updated = await update_versions(self.engines, str(version))
        return {**self.pause.resume(version), "engines_updated": updated}

    def pause_state(self) -> dict[str, Any]:
        return self.pause.state()

    async def engine_state(self) -> dict[str, Any]:
        """Each engine's health and sessions, with the weight version it states (or why it did not)."""
        versions = await read_versions(self.engines)
        return {"engines": [{**e, **versions[e["url"]]} for e in self.engines.describe()],
                "moves": len(self.engines.moves)}
