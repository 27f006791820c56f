"""The engine + Proxy test stack: the built-in SGLang-protocol engine and a Proxy in front of it, over real
HTTP on loopback, with a RolloutManager as its sink and a TransferQueue when asked.

Every test that needs a running Proxy starts it here, so a change to how a Proxy is assembled is made
once; the pytest fixtures ``engine`` and ``proxy_stack`` (tests/conftest.py) are thin wrappers.
"""

from __future__ import annotations

import dataclasses

from typing import Any, Callable, Sequence

from dressage.dataplane import DataPlaneConfig
from dressage.engine.config import EngineConfig
from dressage.engine.server import EngineServer
from dressage.fields import ModelSpec, get_model
from dressage.proxy.config import JournalConfig, ProxyConfig
from dressage.proxy.deployment import Proxy
from dressage.proxy.parsers import ParseEndpoints
from dressage.rollout import RolloutManager

__all__ = ["ProxyStack", "start_engine", "start_proxy", "TEST_MODEL"]

TEST_MODEL = "tiny-moe"
"""The model preset of the stack unless a test names another: small shapes, fast to record."""


def _model(model: str | ModelSpec) -> ModelSpec:
    return get_model(model) if isinstance(model, str) else model


def start_engine(*, model: str | ModelSpec = TEST_MODEL, seed: int = 3, tool_call_rate: float = 0.5,
                 mean_response_tokens: int = 24, make_engine: Callable[[EngineConfig], Any] | None = None,
                 **config: Any) -> EngineServer:
    """The built-in engine on a free loopback port, started (the caller stops it). ``config`` is any
    other :class:`~dressage.engine.config.EngineConfig` field (``token_delay_s``, ``backend``, ...);
    ``make_engine(config)`` builds the :class:`~dressage.engine.Engine` to serve instead of the default."""
    cfg = EngineConfig(model=_model(model), port=0, seed=seed, tool_call_rate=tool_call_rate,
                       mean_response_tokens=mean_response_tokens, **config)
    srv = EngineServer(cfg, engine=make_engine(cfg) if make_engine is not None else None,
                       reply_parsers=ParseEndpoints())
    srv.start_background()
    return srv


class ProxyStack:
    """A running Proxy (``proxy``), the RolloutManager it delivers finalized sessions to (``manager``,
    or ``None`` when the test gave its own sink or none) and the TransferQueue it writes to (``tq``)."""

    def __init__(self, proxy: Proxy, manager: RolloutManager | None, tq: Any) -> None:
        self.proxy, self.manager, self.tq = proxy, manager, tq
        self._closed = False

    @property
    def url(self) -> str:
        return self.proxy.url

    @property
    def service(self) -> Any:
        return self.proxy.service

    @property
    def core(self) -> Any:
        return self.proxy.core

    def steps(self, session_id: str) -> dict[str, Any]:
        """The StepRecords the Proxy holds for ``session_id``."""
        return self.core.sessions[session_id].steps

    def close(self) -> None:
        """Stop the Proxy (and what it started); a second call does nothing."""
        if not self._closed:
            self._closed = True
            self.proxy.shutdown()

    def __enter__(self) -> "ProxyStack":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_proxy(engine_urls: str | Sequence[str], *, model: str | ModelSpec = TEST_MODEL, r3: bool = True,
                tq: Any = None, routed_experts_dtype: str | None = None, manager: RolloutManager | None = None,
                dp_size: int | None = None, sink: Any = None, check_engine: bool = True,
                tokenizer: Any = None, tokenizer_name: str = "byte", engine: Any = None,
                journal: JournalConfig | None = None, data_plane: DataPlaneConfig | None = None,
                request_timeout_s: float = 20.0, **settings: Any) -> ProxyStack:
    """Start a Proxy in this process in front of ``engine_urls`` and return its stack.

    R3 is recorded unless ``r3`` is false; with ``tq`` (a started TransferQueue the caller owns) the large
    fields go to it, R3 as ``routed_experts_dtype`` (default: the data plane's). Finalized sessions go to ``sink`` when given, else to
    ``manager``, else, with ``dp_size``, to a new ``RolloutManager(dp_size=dp_size)``; with none of them
    the Proxy keeps them. ``engine`` replaces the Proxy's SGLang client (a recording transport, say);
    ``tokenizer`` is a tokenizer object shared with the engine, ``tokenizer_name`` the Proxy's setting;
    ``check_engine`` false starts without asking the engine for its model info. ``settings`` are other
    settings of the Proxy's sections (server, access, engines, limits, sessions, reads, tool_call_hooks,
    export) by field name; ``data_plane`` replaces the whole data-plane
    config built from ``model``, ``r3``, ``tq`` and ``routed_experts_dtype``.
    """
    urls = (engine_urls,) if isinstance(engine_urls, str) else tuple(engine_urls)
    if data_plane is None:
        dtype = {} if routed_experts_dtype is None else {"routed_experts_dtype": routed_experts_dtype}
        data_plane = DataPlaneConfig(model=_model(model), use_rollout_routing_replay=r3,
                                     enable_transfer_queue=tq is not None, **dtype)
    if manager is None and sink is None and dp_size is not None:
        manager = RolloutManager(dp_size=dp_size)
    sections = _sections(dict(settings, engine_urls=urls, request_timeout_s=request_timeout_s,
                              skip_engine_check=not check_engine))
    config = ProxyConfig(data_plane=data_plane, tokenizer=tokenizer_name, **sections,
                         **({"journal": journal} if journal is not None else {}))
    proxy = Proxy.start(config, tq=tq, tokenizer=tokenizer, engine=engine,
                        sink=sink if sink is not None else manager)
    return ProxyStack(proxy, manager if sink is None else None, tq)


def _sections(settings: dict[str, Any]) -> dict[str, Any]:
    """The Proxy's section configs (``server=ServerConfig(...)``, ...) holding ``settings``: a whole section by
    its name, or single settings by field name (applied over it); a name no section has is a ``TypeError``."""
    default = ProxyConfig()
    sections = {name: getattr(default, name) for name in ("server", "access", "engines", "limits", "sessions",
                                                                    "reads", "tool_call_hooks", "export")}
    given = {key: settings.pop(key) for key in list(settings) if key in sections}
    fields = {name: {f.name for f in dataclasses.fields(section)} for name, section in sections.items()}
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in settings.items():
        section = next((name for name, names in fields.items() if key in names), None)
        if section is None:
            raise TypeError(f"start_proxy: no Proxy setting named {key!r}")
        grouped.setdefault(section, {})[key] = value
    out = dict(given)
    for name, values in grouped.items():
        out[name] = dataclasses.replace(given[name], **values) if name in given else type(sections[name])(**values)
    return out
