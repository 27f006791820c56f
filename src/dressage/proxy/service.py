"""The Proxy service: the composition root of a Proxy's use cases, with no HTTP in it.

:class:`ProxyService` builds the per-process collaborators (ProxyCore, tokenizer, engine pool, pause,
weight versions, turns, limits, rids, in-flight calls, the session book) and hands them to one
serving object per endpoint (``chat``, ``responses``, ``messages``, ``completions``, ``models``) and to the
trajectory use cases (``trajectories``); it answers only the cross-cutting use cases itself (health,
sessions, stats, pause / resume, engines). :mod:`dressage.proxy.http.app` maps all of them to HTTP.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from dressage.errors import ConfigError, JournalDamagedError
from dressage.proxy.anthropic.serving import MessagesServing
from dressage.proxy.config import JournalConfig, ProxyConfig
from dressage.proxy.engines.pool import EnginePool
from dressage.proxy.engines.rids import RidFactory
from dressage.proxy.engines.startup import engine_clients, engine_pool
from dressage.proxy.engines.versions import read_versions, update_versions
from dressage.observe.otel import call_tracing
from dressage.serving import GC_PAUSES
from dressage.proxy.metrics import ProxyMetrics
from dressage.proxy.openai.chat.samples import ChatSampler
from dressage.proxy.openai.chat.serving import ChatServing
from dressage.proxy.openai.completions import CompletionsServing
from dressage.proxy.openai.model_calls import ModelCalls
from dressage.proxy.openai.models import ModelsServing
from dressage.proxy.openai.responses.protocol import ResponseMemory
from dressage.proxy.openai.responses.serving import ResponsesServing
from dressage.proxy.parsers import ToolCallParser, reply_parser
from dressage.proxy.recording.core import ProxyCore
from dressage.proxy.recording.lifecycle import InFlight
from dressage.proxy.recording.limits import CallLimits
from dressage.proxy.recording.pause import RolloutPause
from dressage.proxy.recording.session_book import SessionBook
from dressage.proxy.recording.turns import CallIdentity, TurnCache
from dressage.proxy.recording.weights import WeightVersions
from dressage.proxy.tool_call_hooks import ToolCallHooks, load_tool_call_hooks
from dressage.proxy.upstream.trajectories import Trajectories

__all__ = ["ProxyService"]


class ProxyService:
    """A Proxy's collaborators and serving objects, and its cross-cutting use cases.

    ``engine`` is an :class:`SGLangClient`, a list of them, an :class:`EnginePool`, or ``None``
    (clients for ``config.engines.urls`` are made here: :func:`dressage.proxy.engines.startup.engine_clients`).
    ``tq_spec()`` gives the TransferQueue client spec a trainer in another process joins (``None``: none).
    """

    def __init__(self, config: ProxyConfig, core: ProxyCore, tokenizer: Any, engine: Any = None,
                 *, parser: ToolCallParser | None = None,
                 tq_spec: Callable[[], dict[str, Any]] | None = None) -> None:
        self.config, self.core, self.tokenizer = config, core, tokenizer
        self._owns_engines = engine is None
        """The engine clients were made here (from ``config.engines``), so :meth:`aclose` closes them."""
        if isinstance(engine, EnginePool):
            self.engines = engine
        else:
            clients = engine if isinstance(engine, (list, tuple)) else [engine] if engine is not None else \
                engine_clients(config.engines)
            self.engines = engine_pool(config.engines, clients)
        discovery = self.engines.discovery
        self.engine = discovery.router if discovery is not None else next(iter(self.engines.members.values())).client
        """The engine the Proxy's own calls go to (reply parsers, the router behind a discovery)."""
        self.parser = parser or reply_parser(config.server.tool_call_parser, config.server.reasoning_parser,
                                             config.data_plane.model.name,
                                             engine=self.engine if config.server.parse_on_engine else None)
        self.versions = WeightVersions(partial_rollout=config.sessions.partial_rollout,
                                       max_preempts=config.sessions.max_partial_rollout_preempts)
        self.pause = RolloutPause(self.versions)
        self.turns = TurnCache(config.sessions.max_cached_turns)
        self.limits = CallLimits(config.limits)
        self.rids = RidFactory()
        """Engine rids: one length and shape, so SGLang's abort by rid prefix hits only the call meant."""
        self.in_flight = InFlight()
        """Model calls running per session (finalize waits for them)."""
        memory = ResponseMemory()
        self.book = SessionBook(core, self.in_flight, timeout_s=config.sessions.session_timeout_s,
                                max_sessions=config.sessions.max_sessions,
                                forgetters=(self.engines.forget, self.turns.forget_session, memory.forget,
                                            self.versions.forget))
        """Header-created sessions, per-session forgetting and the call counters, shared by every endpoint."""
        calls = ModelCalls(config, core, tokenizer, engines=self.engines, pause=self.pause, versions=self.versions,
                           limits=self.limits, rids=self.rids, book=self.book,
                           keep_special_tokens=getattr(self.parser, "special_markers", False))
        hooks = config.tool_call_hooks
        self.tool_call_hooks = ToolCallHooks(load_tool_call_hooks(hooks.hooks), before_timeout_s=hooks.before_timeout_s)
        """Upstream's tool-call hooks (none unless configured)."""
        self.chat = ChatServing(config, core, tokenizer, calls=calls,
                                sampler=ChatSampler(config, calls, self.parser), turns=self.turns,
                                limits=self.limits, in_flight=self.in_flight, book=self.book,
                                hooks=self.tool_call_hooks)
        self.responses = ResponsesServing(config, core, chat=self.chat, memory=memory, parser=self.parser)
        self.messages = MessagesServing(config, core, tokenizer, chat=self.chat, parser=self.parser, book=self.book)
        self.completions = CompletionsServing(config, tokenizer, calls=calls, limits=self.limits,
                                              in_flight=self.in_flight, book=self.book)
        self.models = ModelsServing(config, core)
        self.trajectories = Trajectories(config, core, in_flight=self.in_flight, book=self.book, stats=self.stats,
                                         tq_spec=tq_spec)
        self.trajectories.on_end = self.pause.end_session  # a held call of an ended session fails at once
        self.replay_s: float | None = None
        """Seconds the journal replay took at start (``None``: nothing was replayed)."""
        self.metrics = ProxyMetrics(self)
        self.tracing = call_tracing(config.server.otel_exporter)
        """OpenTelemetry spans of each call (``None``: not exported)."""
        """``GET /metrics``: read from the collaborators above at scrape time, plus the call histograms."""

    def recover(self, journal: JournalConfig) -> Any:
        """Replay ``journal`` into the (empty) core, take back what it held, then journal from there on.

        A journal damaged before its end is refused (:class:`JournalDamagedError`, naming the offset
        and what lies after it) unless ``journal.recover`` is ``truncate``. Returns the recovery report.
        """
        from dressage.proxy.journal.log import Journal

        def accept(report: Any) -> None:
            if report.mid_journal_damage and journal.recover != "truncate":
                raise JournalDamagedError(
                    f"journal {journal.path} is damaged: {report.damage_text()}. Starting would drop them: run "
                    f"`dressage proxy journal repair {journal.path}` (the rest is kept aside), or start with "
                    "--journal-recover truncate")

        began = time.perf_counter()
        report = self.core.recover(journal.path, accept=accept)
        self.replay_s = time.perf_counter() - began
        self.versions.restore(self.core.sessions.values())  # named versions keep their codes
        self.trajectories.adopt(report.delivered, report.acknowledged_reads)
        # Appends start where replay stopped: a record the replay refused is cut (and set aside) too.
        self.core.journal = Journal(journal.path, fsync=journal.fsync, intact_bytes=report.intact_bytes)
        self.metrics.watch_journal(self.core.journal)
        if self.core.journal.set_aside is not None:
            report.set_aside = str(self.core.journal.set_aside)
        self.book.keeper.adopt()  # resumed sessions expire like any other
        return report

    async def aclose(self) -> None:
        """Stop the engine health checks and close the engine clients this service made, on the event loop
        that used them (the server's, once it stopped serving)."""
        await self.engines.close(clients=self._owns_engines)
        if self.tracing is not None:
            self.tracing.close()  # the spans still batched are exported

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

    # ---------------------------------------------------------- sessions
    def session_url(self, base: str, session_id: str) -> str:
        return f"{base.rstrip('/')}/sessions/{session_id}/v1"

    def header_session(self, ident: CallIdentity) -> str:
        """The session a header-identified call belongs to, created by its first call."""
        return self.book.header_session(ident)

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "sessions": len(self.core.sessions), "weight_version": self.weight_version}

    def create_session(self, metadata: dict[str, Any] | None, base_url: str) -> dict[str, Any]:
        s = self.book.create(metadata)
        return {"session_id": s.session_id, "base_url": self.session_url(base_url, s.session_id)}

    def session_info(self, session_id: str) -> dict[str, Any]:
        s = self.core.session(session_id)
        return {"session_id": s.session_id, "state": s.state, "steps": len(s.steps),
                "lineages": len({st.lineage_id for st in s.steps.values()}), "metadata": s.metadata}

    def stats(self) -> dict[str, Any]:
        """Counters for ``GET /trajectory/stats``."""
        states: dict[str, int] = {"active": 0, "finalized": 0, "aborted": 0}
        steps = tokens = 0
        for s in list(self.core.sessions.values()):
            states[s.state] = states.get(s.state, 0) + 1
            steps += len(s.steps)
            tokens += sum(st.response_len for st in s.steps.values())
        book, done = self.book, self.trajectories
        return {"sessions": states, "steps": steps, "response_tokens": tokens,
                "unread_trajectories": len(done.finalized), "leased_reads": len(done.leases),
                "expired_leases": done.leases.expired,
                "unread_segments": sum(len(d.segments) for d in done.finalized.values()),
                "calls": book.calls, "failed_calls": book.failed_calls, "replayed_turns": book.replayed_turns,
                "pending_writes": self.core.write_behind.pending(),
                "weight_version": self.weight_version, "pause": self.pause.state(),
                "engines": self.engines.describe(), "engine_moves": len(self.engines.moves),
                "evicted_sessions": self.book.keeper.evicted,
                "heap_trims": done.heap_trims, "heap_trim_ms": round(done.heap_trim_s * 1e3, 3),
                "tokenizer_cpu_s": round(float(getattr(self.tokenizer, "cpu_s", 0.0)), 6),
                "gc": GC_PAUSES.snapshot()}

    # ----------------------------------------------------- rollout, engines
    async def pause_rollout(self, *, session_id: str | None = None, instance_id: str | None = None,
                            timeout_s: float | None = None) -> dict[str, Any]:
        """Pause every call, or only a session's / a prompt instance's (see :class:`RolloutPause`)."""
        return await self.pause.pause(session_id=session_id, instance_id=instance_id, timeout_s=timeout_s)

    def resume_rollout(self, version: int | str | None) -> dict[str, Any]:
        """Release every paused call; ``version`` (a number or the engine's string) is the new fallback."""
        return self.pause.resume(version)

    async def resume_updating_engines(self, version: int | str | None) -> dict[str, Any]:
        """Set ``version`` on every engine (each worker behind a router), then resume; engines that are
        gone are named in ``engines_unreachable`` (they take no session until they have the version);
        when an engine answers and fails, a 502 names it and the ones updated, and the Proxy stays
        as it was (paused)."""
        if version is None:
            raise ConfigError("resume: update_engines needs a weight_version or version to set")
        update = await update_versions(self.engines, str(version))
        return {**self.pause.resume(version), "engines_updated": update.updated,
                "engines_unreachable": update.unreachable}

    def pause_state(self) -> dict[str, Any]:
        return self.pause.state()

    async def engine_state(self) -> dict[str, Any]:
        """Each engine's health and sessions, with the weight version it states (or why it did not)."""
        versions = await read_versions(self.engines)
        return {"engines": [{**e, **versions[e["url"]]} for e in self.engines.describe()],
                "moves": len(self.engines.moves)}
