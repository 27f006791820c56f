"""The Proxy service: every use case of the Proxy, with no HTTP in it.

:class:`ProxyService` owns the per-process state (ProxyCore, tokenizer, engine pool, pause state,
turns, finalized trajectories) and answers each endpoint's question as plain values or a
:class:`dressage.errors.DressageError`; :mod:`dressage.proxy.http` only maps them to HTTP. The
model-call use cases (chat, token-level generate) are in :class:`dressage.proxy.calls.CallPath`.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from typing import Any, Iterable

from dressage.errors import MissingSessionIdError, SessionIdError, SessionStateError
from dressage.proxy.calls import CallPath
from dressage.proxy.chat import QwenToolCallParser, ToolCallParser
from dressage.proxy.config import ProxyServerConfig
from dressage.proxy.core import FinalizedSession, ProxyCore
from dressage.proxy.engine_pool import EnginePool
from dressage.proxy.limits import CallLimits
from dressage.proxy.pause import RolloutPause
from dressage.proxy.sample_wire import samples_wire
from dressage.proxy.session_caps import SessionKeeper
from dressage.proxy.sglang_client import SGLangClient
from dressage.proxy.turns import CallIdentity, TurnCache, instance_group

__all__ = ["ProxyService"]


class ProxyService(CallPath):
    """Per-process state behind the HTTP module, and every use case of the Proxy.

    ``engine`` is an :class:`SGLangClient`, a list of them, an :class:`EnginePool`, or ``None``
    (clients for ``config.engines`` are made here, with ``config.request_timeout_s``).
    """

    def __init__(self, config: ProxyServerConfig, core: ProxyCore, tokenizer: Any, engine: Any = None,
                 *, parser: ToolCallParser | None = None) -> None:
        self.config, self.core, self.tokenizer = config, core, tokenizer
        self.tq_spec: Any = None  # () -> TQ client spec, set by Proxy.start when it has a deployment
        if isinstance(engine, EnginePool):
            self.engines = engine
        else:
            clients = engine if isinstance(engine, (list, tuple)) else [engine] if engine is not None else [
                SGLangClient(url, timeout=config.request_timeout_s) for url in config.engines]
            self.engines = EnginePool(clients, failures_to_remove=config.health_check_failures)
        self.engine = next(iter(self.engines.members.values())).client
        self.parser = parser or QwenToolCallParser()
        self.pause = RolloutPause()
        self.turns = TurnCache(config.max_cached_turns)
        self.finalized: dict[str, FinalizedSession] = {}
        self.calls = self.failed_calls = self.replayed_turns = 0
        self.limits = CallLimits(config)
        self.keeper = SessionKeeper(core, timeout_s=config.session_timeout_s, max_sessions=config.max_sessions,
                                    on_evict=self._evicted)
        self._fresh: set[str] = set()
        """Sessions a header call created whose first call has not recorded yet (dropped if it fails)."""
        self._rid_prefix = secrets.token_hex(3)
        self._rids = itertools.count()
        self._tasks: set[asyncio.Task] = set()

    @property
    def weight_version(self) -> int:
        """The policy version new tokens are recorded with."""
        return self.pause.weight_version

    @weight_version.setter
    def weight_version(self, value: int) -> None:
        self.pause.weight_version = int(value)

    def session_url(self, base: str, session_id: str) -> str:
        return f"{base.rstrip('/')}/sessions/{session_id}/v1"

    def header_session(self, ident: CallIdentity) -> str:
        """The session a header-identified call belongs to, created by its first call."""
        if not ident.session_id:
            raise MissingSessionIdError("send the session in an X-Session-Id (or X-SMG-Routing-Key) header, "
                                        "or use a session's base URL /sessions/{id}/v1")
        sid = ident.session_id
        if len(sid) > 256 or not sid.isprintable():
            raise SessionIdError("a session id is at most 256 printable characters")
        if sid not in self.core.sessions:
            meta: dict[str, Any] = {"session_source": "headers"}
            if ident.instance_id is not None:
                meta.update(instance_id=ident.instance_id, group_index=instance_group(ident.instance_id))
            self.keeper.admit()
            try:
                self.core.create_session(meta, session_id=sid)
            except SessionStateError:
                return sid  # a concurrent first call created it
            self.keeper.touch(sid)
            self._fresh.add(sid)
        return sid

    def drop_if_unused(self, session_id: str) -> None:
        """A header-created session whose first call failed is dropped: a failed call leaves nothing."""
        if session_id in self._fresh and not self.keeper.is_busy(session_id):
            self._fresh.discard(session_id)
            if self.core.drop_unused(session_id):
                self.keeper.release(session_id)
                self.engines.forget(session_id)
                self.limits.forget(session_id)

    def _evicted(self, session_id: str) -> None:
        self._fresh.discard(session_id)
        self.engines.forget(session_id)
        self.turns.forget_session(session_id)
        self.limits.forget(session_id)

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
        return {"object": "list", "data": [{"id": self.config.served_model_name, "object": "model",
                                            "owned_by": "dressage"}]}

    # --------------------------------------------------------- lifecycle
    def finalize(self, session_id: str, reward: float | None) -> FinalizedSession:
        done = self.core.finalize(session_id, reward)
        self.keeper.release(session_id)
        self.finalized[session_id] = done
        return done

    def finalize_summary(self, session_id: str | None, reward: float | None) -> dict[str, Any]:
        """Finalize (``session_id`` from the body or the headers) and summarise what it built."""
        if not session_id:
            raise MissingSessionIdError("give session_id in the body or an X-Session-Id header")
        done = self.finalize(session_id, reward)
        return {"session_id": session_id, "segments": len(done.segments), "reward": done.reward}

    def abort(self, session_id: str) -> dict[str, Any]:
        """Abort a session: its TQ keys are deleted and nothing more may be recorded."""
        released = self.core.abort(session_id)
        self.keeper.release(session_id)
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

    def read_trajectories(self, session_ids: Iterable[str] = (), instance_id: str | None = None,
                          drain: bool = False, format: str = "segments") -> dict[str, Any]:
        """Finalized trajectories: those named, those of one prompt instance, or all; ``drain`` forgets them.

        ``format="samples"`` answers, per trajectory, its Samples in wire form (large fields as
        FieldRefs when TQ is on) in upstream's envelope, with the TQ client spec in ``meta_info``:
        what a trainer in another process needs (:mod:`dressage.train.remote`). A drain hands the
        TQ keys to that trainer, which releases them after training.
        """
        wanted = list(session_ids)
        if instance_id is not None:
            wanted += [sid for sid, d in self.finalized.items()
                       if str(d.metadata.get("instance_id")) == instance_id and sid not in wanted]
        elif not wanted:
            wanted = list(self.finalized)
        out = []
        for sid in wanted:
            done = self._finalized(sid, "its trajectory exists")
            if format == "samples":
                out.append({"session_id": sid, "reward": done.reward, "metadata": done.metadata,
                            "samples": samples_wire(done)})
            else:
                out.append({"session_id": sid, "reward": done.reward, "metadata": done.metadata,
                            "segments": [seg.to_summary() for seg in done.segments]})
        if drain:
            self.forget(wanted)
        if format == "samples":
            spec = self.tq_spec() if self.tq_spec is not None else None
            return {"success": True, "mode": "samples", "data": out, "drained": drain,
                    "meta_info": {"trajectories": len(out), "transfer_queue": spec}}
        return {"trajectories": out, "drained": drain}

    def forget(self, session_ids: Iterable[str]) -> None:
        """Drop finished sessions once their Samples were consumed."""
        for sid in list(session_ids):
            self.finalized.pop(sid, None)
            self.core.forget(sid)
            self.engines.forget(sid)
            self.turns.forget_session(sid)
            self.limits.forget(sid)
            self.keeper.release(sid)

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
                "evicted_sessions": self.keeper.evicted}

    # ----------------------------------------------------- rollout, engines
    async def pause_rollout(self) -> dict[str, Any]:
        return await self.pause.pause()

    def resume_rollout(self, weight_version: int | None) -> dict[str, Any]:
        return self.pause.resume(weight_version)

    def pause_state(self) -> dict[str, Any]:
        return self.pause.state()

    def engine_state(self) -> dict[str, Any]:
        return {"engines": self.engines.describe(), "moves": len(self.engines.moves)}
