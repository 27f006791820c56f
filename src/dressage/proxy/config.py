"""The Proxy's configuration: the root :class:`ProxyConfig` that :meth:`Proxy.start` takes, and its sections.

Sections: ``server`` (the HTTP listener), ``access`` (tokens), ``engines``, ``limits`` (per call),
``sessions``, ``reads`` (what a batch trajectory read hands over), ``token_build``, ``tool_call_hooks``,
``journal``, ``transfer_queue`` and ``data_plane``. Every value is checked once, in ``__post_init__``, with its dotted
key in the message; the tree is ``dressage proxy serve``'s flags and YAML. Upstream Dressage's flags are
flat aliases of the same settings, and :func:`upstream_environment` reads its ``DRESSAGE_*`` variables.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from dressage.dataplane import DataPlaneConfig
from dressage.errors import ConfigError
from dressage.flags import flag, read_secret_file
from dressage.observe.logs import LOG_FORMATS
from dressage.observe.otel import OTEL_EXPORTERS
from dressage.proxy.parsers.registry import AUTO, REASONING_PARSERS, TOOL_CALL_PARSERS
from dressage.tq.config import TransferQueueSelection, is_loopback
from dressage.units import parse_count

__all__ = ["ProxyConfig", "ServerConfig", "AccessConfig", "EnginesConfig", "LimitsConfig", "SessionsConfig",
           "ReadsConfig", "TokenBuildConfig", "ToolCallHooksConfig", "JournalConfig", "TrajectoryExportConfig",
           "DataPlaneConfig", "TransferQueueSelection", "upstream_environment", "environment_overrides",
           "PARSE_BACKENDS", "UPSTREAM_TOOL_CALL_TYPES", "UPSTREAM_REASONING_TYPES", "admin_token_of"]

FSYNC_POLICIES = ("always", "interval", "never")
JOURNAL_RECOVER_MODES = ("refuse", "truncate")
AGENT_TOKEN_ENV = "DRESSAGE_PROXY_TOKEN"
ADMIN_TOKEN_ENV = "DRESSAGE_ADMIN_TOKEN"
NO_AUTH = "no-auth"
"""The ``--api-key`` value upstream's Proxy takes for "no bearer check" (its default)."""
PARSE_BACKENDS = ("local", "sglang_api", "hybrid")
"""Upstream's ``--tool-call-parse-backend`` / ``--reasoning-parse-backend`` values."""
UPSTREAM_TOOL_CALL_TYPES = {"qwen3_5": "qwen3_coder", "qwen3_6": "qwen3_coder"}
"""Upstream's ``--model-tool-call-type`` model names -> the SGLang parser that reads that family's calls
(its other value, ``hermes``, is a parser name already)."""
UPSTREAM_REASONING_TYPES = {"qwen3_5": "qwen3", "qwen3_6": "qwen3"}
"""Upstream's ``--model-reasoning-type`` model names -> the SGLang reasoning parser of that family."""
TOKEN_BUILD_MODELS = ("qwen3_5", "qwen3_6")
"""Upstream's ``--token-build-model`` / ``--tito-model`` families."""


def _url_ok(url: object) -> bool:
    return isinstance(url, str) and url.startswith(("http://", "https://"))


def admin_token_of(path: str | None, what: str) -> str | None:
    """The admin token a trainer-side command (``dressage trainer``, ``dressage export``) sends to a Proxy:
    read from the file ``path`` when given (``what`` names its setting in errors), else ``$DRESSAGE_ADMIN_TOKEN``."""
    if path:
        return read_secret_file(path, what)
    return os.environ.get(ADMIN_TOKEN_ENV) or None


def _positive_int(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")


def _optional_positive_int(key: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{key} must be a positive integer or unset, got {value!r}")


@dataclass(kw_only=True, slots=True)
class ServerConfig:
    """The HTTP listener agents and the trainer talk to: bind address, names, connection limits."""

    host: str = "127.0.0.1"
    """Bind address; loopback unless the agents run elsewhere."""
    port: int = 0
    """Port; 0 picks a free one."""
    public_url: str | None = field(default=None, metadata=flag(metavar="URL"))
    """The base URL agents reach this Proxy at (``http(s)://host:port[/prefix]``), used in the session URLs
    it hands out; unset: the address each request's connection reached. Never the request's ``Host``."""
    served_model_name: str = field(default="dressage-policy", metadata=flag(metavar="NAME"))
    """``model`` reported in OpenAI responses and ``/v1/models``."""
    max_body_bytes: int = field(default=32 * 1024 * 1024, metadata=flag(metavar="N"))
    """Larger request bodies get 413."""
    max_header_bytes: int = field(default=64 * 1024, metadata=flag(metavar="N"))
    """Request line plus headers larger than this get 400 ``headers_too_large`` (a JSON error) and the
    connection is closed."""
    header_timeout_s: float = field(default=30.0, metadata=flag("--header-timeout", metavar="S"))
    """A connection whose request line and headers are not complete this long after it opened (or
    after its previous answer, once bytes of a next request came) is closed."""
    body_timeout_s: float = field(default=120.0, metadata=flag("--body-timeout", metavar="S"))
    """A request body that has not fully arrived this long after its headers: the connection is closed."""
    keep_alive_timeout_s: float = field(default=30.0, metadata=flag("--keep-alive-timeout", metavar="S"))
    """An idle keep-alive connection is closed after this long."""
    tool_call_parser: str = field(default=AUTO, metadata=flag(metavar="NAME", aliases=("--model-tool-call-type",)))
    """How replies' tool calls are read (SGLang's parser names, or upstream's model names ``qwen3_5`` /
    ``qwen3_6``); ``auto``: from the served model's name (the engine's ``model_path``, then ``--model``),
    see :mod:`dressage.proxy.parsers.registry`."""
    reasoning_parser: str = field(default=AUTO, metadata=flag(metavar="NAME", aliases=("--model-reasoning-type",)))
    """How replies' reasoning blocks are read (SGLang's parser names, or upstream's model names);
    ``auto``: the model's default."""
    log_format: str = field(default="text", metadata=flag(choices=LOG_FORMATS))
    """Log lines as ``text`` or as ``json``: one object a line, with the session, call and trace ids of the
    call being served (``dressage proxy serve`` sets the process's logging up so)."""
    otel_exporter: str = field(default="none", metadata=flag(choices=OTEL_EXPORTERS))
    """OpenTelemetry spans (one per call; the engine request, the TQ write and the commit as children):
    ``none``, ``console`` (stdout) or ``otlp`` (the ``OTEL_EXPORTER_OTLP_*`` variables name the collector);
    needs ``pip install 'dressage[otel]'``."""
    parse_on_engine: bool = False
    """Ask the engine to parse whole replies (SGLang's ``/parse_function_call`` and
    ``/separate_reasoning``, with the parser names above) instead of parsing them in the Proxy;
    streamed text is still shown by the Proxy's parser of the same name."""
    tool_call_parse_backend: str | None = field(default=None, metadata=flag(choices=PARSE_BACKENDS))
    """Upstream's choice of where tool calls are parsed: ``sglang_api`` sets ``parse_on_engine``;
    ``local`` and ``hybrid`` (local first) parse in the Proxy, whose parsers cover every family it names."""
    reasoning_parse_backend: str | None = field(default=None, metadata=flag(choices=PARSE_BACKENDS))
    """Upstream's choice of where reasoning is separated; the same values. Both parse in one place here:
    given together they must agree."""
    stream_heartbeat_interval_s: float = field(default=0.0, metadata=flag("--stream-heartbeat-interval-seconds",
                                                                          metavar="S"))
    """While a streamed call has sent nothing for this long, an SSE comment line (``: dressage-heartbeat``)
    keeps idle-timeout proxies and clients from closing it; 0: none (a paused call still sends
    keep-alives). Upstream's module defaults to 15; each streamed frame then costs ~15 us more."""

    def __post_init__(self) -> None:
        self.tool_call_parser = UPSTREAM_TOOL_CALL_TYPES.get(self.tool_call_parser, self.tool_call_parser)
        self.reasoning_parser = UPSTREAM_REASONING_TYPES.get(self.reasoning_parser, self.reasoning_parser)
        backends = {b for b in (self.tool_call_parse_backend, self.reasoning_parse_backend) if b is not None}
        for key in ("tool_call_parse_backend", "reasoning_parse_backend"):
            if getattr(self, key) not in (None, *PARSE_BACKENDS):
                raise ConfigError(f"server.{key}: expected one of {', '.join(PARSE_BACKENDS)}, got {getattr(self, key)!r}")
        on_engine = {b == "sglang_api" for b in backends}
        if len(on_engine) > 1:
            raise ConfigError("server.tool_call_parse_backend and server.reasoning_parse_backend: this Proxy parses "
                              f"tool calls and reasoning in one place; got {self.tool_call_parse_backend!r} and "
                              f"{self.reasoning_parse_backend!r}")
        if on_engine:
            self.parse_on_engine = on_engine.pop()
        if isinstance(self.stream_heartbeat_interval_s, bool) \
                or not isinstance(self.stream_heartbeat_interval_s, (int, float)) \
                or not math.isfinite(self.stream_heartbeat_interval_s) or self.stream_heartbeat_interval_s < 0:
            raise ConfigError(f"server.stream_heartbeat_interval_s must be a finite number >= 0, "
                              f"got {self.stream_heartbeat_interval_s!r}")
        if self.otel_exporter not in OTEL_EXPORTERS:
            raise ConfigError(f"server.otel_exporter: expected one of {', '.join(OTEL_EXPORTERS)}, "
                              f"got {self.otel_exporter!r}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"server.log_format: expected one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}")
        if self.tool_call_parser != AUTO and self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ConfigError(f"server.tool_call_parser: unknown parser {self.tool_call_parser!r}; "
                              f"known: {AUTO}, {', '.join(sorted(TOOL_CALL_PARSERS))}")
        if self.reasoning_parser != AUTO and self.reasoning_parser not in REASONING_PARSERS:
            raise ConfigError(f"server.reasoning_parser: unknown parser {self.reasoning_parser!r}; "
                              f"known: {AUTO}, {', '.join(sorted(REASONING_PARSERS))}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"server.port: {self.port!r} is not a port")
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"server.host: expected a host name or address, got {self.host!r}")
        if self.public_url is not None:
            if not _url_ok(self.public_url) or any(c.isspace() for c in self.public_url):
                raise ConfigError(f"server.public_url: expected http(s)://host:port, got {self.public_url!r}")
            self.public_url = self.public_url.rstrip("/") + "/"
        for key in ("header_timeout_s", "body_timeout_s", "keep_alive_timeout_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"server.{key} must be positive, got {getattr(self, key)!r}")
        for key in ("max_body_bytes", "max_header_bytes"):
            _positive_int(f"server.{key}", getattr(self, key))


@dataclass(kw_only=True, slots=True)
class AccessConfig:
    """Bearer tokens of the agents and of the trainer (none: only a loopback listener is allowed)."""

    api_token: str | None = field(default=None, metadata=flag(metavar="TOKEN", default_text="$" + AGENT_TOKEN_ENV,
                                                              aliases=("--api-key",)))
    """Agents' token: when set, every endpoint but /health needs ``Authorization: Bearer <token>``.
    Alone (no admin token) it also opens the admin endpoints; ``no-auth`` (upstream's default) turns
    the check off. Prefer the environment or a file: arguments show in ``ps``."""
    api_token_file: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """Read the agents' token from this file (the token alone, stripped; an empty file is refused)."""
    admin_token: str | None = field(default=None, metadata=flag(metavar="TOKEN", default_text="$" + ADMIN_TOKEN_ENV))
    """Trainer's token: when set, trajectory read / drain, pause / resume, discard and the engine
    endpoints need it (agent tokens get 403 there); it opens the agent endpoints too."""
    admin_token_file: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """Read the admin token from this file (the token alone, stripped; an empty file is refused)."""
    no_auth: bool = False
    """Serve without an agents' token even on an address other machines reach (``--api-key no-auth``
    says the same, as upstream's Proxy does by default)."""

    def __post_init__(self) -> None:
        if self.api_token == NO_AUTH:
            self.api_token, self.no_auth = None, True
        for key in ("api_token", "admin_token"):
            path = getattr(self, key + "_file")
            if path is not None:
                if getattr(self, key) is not None:
                    raise ConfigError(f"access.{key} and access.{key}_file are both set: give one")
                setattr(self, key, read_secret_file(path, f"access.{key}_file"))
            token = getattr(self, key)
            if token is not None and (not isinstance(token, str) or not token.strip() or not token.isprintable()
                                      or len(token) > 4096):
                raise ConfigError(f"access.{key}: a token is 1-4096 printable characters")
        if self.api_token is not None and self.api_token == self.admin_token:
            raise ConfigError("access.admin_token: the same as the agents' api_token (leave it unset for one token)")


ROUTER_MODES = ("discovery", "data_path")
"""How a router is used: as the list of workers, or on the path of every ``/generate``."""


@dataclass(kw_only=True, slots=True)
class EnginesConfig:
    """The SGLang engines (or one router) behind the Proxy, and how they are called and checked."""

    engine_url: str = field(default="http://127.0.0.1:30000", metadata=flag(skip=True))
    """SGLang (or the built-in engine) base URL; the first of ``engine_urls`` when those are given."""
    engine_urls: tuple[str, ...] = field(default=(), metadata=flag("--engine-url", append=True, metavar="URL"))
    """Several engines (``--engine-url`` repeated); sessions stick to one by consistent hashing."""
    router_url: str | None = field(default=None, metadata=flag("--sglang-router-url", metavar="URL"))
    """An sglang-router / model gateway as the one engine endpoint: the same as ``--engine-url URL --router``."""
    router: bool = False
    """The engine URL is an sglang-router / model gateway (how it is used: ``router_mode``)."""
    router_mode: str = field(default="discovery", metadata=flag(choices=ROUTER_MODES, metavar="MODE"))
    """With a router: ``discovery`` (the Proxy lists the router's workers, ``GET /workers``, places each
    session on one itself and sends ``/generate`` straight to it, so R3 works behind any router) or
    ``data_path`` (``/generate`` goes through the router, which must forward the R3 fields; aborts and
    weight versions go to its workers)."""
    engine_api_key: str | None = field(default=None, metadata=flag(metavar="KEY"))
    """The engine's ``--api-key``: sent as ``Authorization: Bearer`` on every engine and worker call."""
    request_timeout_s: float = field(default=600.0, metadata=flag("--request-timeout", metavar="S"))
    """Time-out of one engine call (a 504 to the agent when exceeded): a streamed call must end within it
    as a whole, however often the engine sends keep-alives."""
    max_answer_bytes: int = field(default=256 * 1024 * 1024,
                                  metadata=flag("--max-engine-answer-bytes", metavar="N"))
    """Cap on one engine answer (as declared or as received) and on one line of a streamed answer: beyond
    it the call is a 502 ``engine_answer_too_large``, and the Proxy held at most this much of it."""
    health_check_interval_s: float = field(default=5.0, metadata=flag("--health-check-interval", metavar="S"))
    """Seconds between engine health checks when there are several engines (0: no checks)."""
    health_check_failures: int = field(default=1, metadata=flag(metavar="N"))
    """Consecutive failed health checks that take an engine out of the pool."""
    skip_engine_check: bool = False
    """Start without asking the engine for its model info (no shape or tokenizer check)."""
    engine_wait_s: float = field(default=30.0, metadata=flag("--engine-wait", metavar="S"))
    """How long start-up waits for an engine that does not answer yet (one that is still loading)."""

    def __post_init__(self) -> None:
        self.engine_urls = tuple(self.engine_urls or ())
        for i, url in enumerate(self.engine_urls):
            if not _url_ok(url):
                raise ConfigError(f"engines.engine_urls[{i}]: expected http(s)://host:port, got {url!r}")
        if len({u.rstrip("/") for u in self.engine_urls}) != len(self.engine_urls):
            raise ConfigError(f"engines.engine_urls: an engine is listed twice: {list(self.engine_urls)}")
        if self.router_url is not None:
            if not _url_ok(self.router_url):
                raise ConfigError(f"engines.router_url: expected http(s)://host:port, got {self.router_url!r}")
            if self.engine_urls and [u.rstrip("/") for u in self.engine_urls] != [self.router_url.rstrip("/")]:
                raise ConfigError(f"engines.router_url: the router {self.router_url} is the one engine endpoint; "
                                  f"do not also give --engine-url {' '.join(self.engine_urls)}")
            self.engine_urls, self.router = (self.router_url,), True
        if self.engine_urls:
            self.engine_url = self.engine_urls[0]
        if self.router_mode not in ROUTER_MODES:
            raise ConfigError(f"engines.router_mode: expected one of {', '.join(ROUTER_MODES)}, got {self.router_mode!r}")
        if self.router and len(self.urls) > 1:
            raise ConfigError(f"engines.router: a router is one engine endpoint, got {len(self.urls)} engine URLs")
        if not _url_ok(self.engine_url):
            raise ConfigError(f"engines.engine_url: expected http(s)://host:port, got {self.engine_url!r}")
        if not self.request_timeout_s > 0:
            raise ConfigError(f"engines.request_timeout_s must be positive, got {self.request_timeout_s!r}")
        _positive_int("engines.max_answer_bytes", self.max_answer_bytes)
        if self.health_check_interval_s < 0:
            raise ConfigError(f"engines.health_check_interval_s must be >= 0, got {self.health_check_interval_s!r}")
        if isinstance(self.health_check_failures, bool) or not isinstance(self.health_check_failures, int) \
                or self.health_check_failures < 1:
            raise ConfigError(f"engines.health_check_failures must be an integer >= 1, "
                              f"got {self.health_check_failures!r}")
        if isinstance(self.engine_wait_s, bool) or not isinstance(self.engine_wait_s, (int, float)) \
                or self.engine_wait_s < 0:
            raise ConfigError(f"engines.engine_wait_s must be >= 0, got {self.engine_wait_s!r}")

    @property
    def urls(self) -> tuple[str, ...]:
        """Every engine URL, in the order given."""
        return self.engine_urls or (self.engine_url,)


def tokens(text: str) -> int:
    """A token count as ``4096``, ``4K`` or ``1M`` (argparse names this function in its errors)."""
    return parse_count(text, "token count")


@dataclass(kw_only=True, slots=True)
class LimitsConfig:
    """What one model call may ask for: its token budget and the context it may fill."""

    default_max_new_tokens: int | None = field(default=None, metadata=flag("--default-max-tokens", metavar="N",
                                                                            parse=tokens))
    """max_new_tokens when a request gives no max_tokens. ``None``: the reply may run to what the
    context window leaves (window - prompt - 1), or to the engine's own default when no window is known."""
    context_length: int | None = field(default=None, metadata=flag("--context-window", metavar="N", parse=tokens))
    """Prompt + reply tokens one call may use: max new tokens are clamped to what is left, and a
    prompt that leaves no room for one token gets ``context_overflow`` (nothing recorded). ``None``:
    the engines' own window, learnt from their model and server info at start-up (when they tell it);
    a value larger than theirs is lowered to it."""
    max_output_tokens: int | None = field(default=None, metadata=flag(metavar="N", parse=tokens))
    """Cap on any call's new tokens, whatever the request asks."""
    max_steps_per_session: int | None = field(default=None, metadata=flag(metavar="N"))
    """Calls one session may record; the next gets ``max_steps_exceeded``. ``None``: no limit."""
    dynamic_max_tokens: bool = field(default=True, metadata=flag("--no-dynamic-max-tokens"))
    """Derive a call's max new tokens from what the context window leaves, and clamp what it asks to
    that; off (``--no-dynamic-max-tokens``): the request's (or the default) budget goes to the engine
    as asked (a prompt that fills the window is still refused)."""
    default_temperature: float | None = field(default=None, metadata=flag("--rollout-temperature", metavar="T"))
    """Sampling temperature of a call whose body gives none; ``None``: the engine's default."""
    inflight_bytes: int | None = field(default=None, metadata=flag(metavar="N"))
    """Bytes of engine answers the calls in flight may hold together: each call reserves (prompt + max
    new tokens) x what a token's fields take in the answer before its engine request, and waits while
    the budget has no room (a call larger than the budget runs alone). ``None``: no bound."""
    inflight_wait_s: float = field(default=30.0, metadata=flag(metavar="S"))
    """How long a call waits for room in ``inflight_bytes``; then it gets 503 ``proxy_overloaded``."""

    def __post_init__(self) -> None:
        for key in ("default_max_new_tokens", "context_length", "max_output_tokens", "max_steps_per_session",
                    "inflight_bytes"):
            _optional_positive_int(f"limits.{key}", getattr(self, key))
        w = self.inflight_wait_s
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w < float("inf"):
            raise ConfigError(f"limits.inflight_wait_s must be a number of seconds > 0, got {w!r}")
        if not isinstance(self.dynamic_max_tokens, bool):
            raise ConfigError(f"limits.dynamic_max_tokens must be true or false, got {self.dynamic_max_tokens!r}")
        t = self.default_temperature
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 2):
            raise ConfigError(f"limits.default_temperature must be in [0, 2], got {t!r}")


@dataclass(kw_only=True, slots=True)
class SessionsConfig:
    """How long sessions live, how many the Proxy holds, and what a weight update does to them."""

    finalize_wait_s: float = field(default=30.0, metadata=flag("--finalize-wait", metavar="S"))
    """How long ``/session/finalize`` waits for the session's calls still in flight before it cuts the trajectory."""
    partial_rollout: bool = field(default=False, metadata=flag(aliases=("--dressage-partial-rollout",)))
    """Keep generations cut by a pause and resume them under the new weights (one response,
    per-token versions). Off: such a call, and any trajectory whose weight version changes, is rejected."""
    session_timeout_s: float = field(default=3600.0, metadata=flag("--session-timeout", metavar="S"))
    """An active session with no call for this long (none in flight) is aborted and forgotten (its
    TQ keys released); 0 keeps sessions until finalized or aborted."""
    max_sessions: int = field(default=65_536, metadata=flag(metavar="N"))
    """Live (active) sessions the Proxy holds; a new one beyond it gets 429 ``too_many_sessions``
    once no idle session is left to evict."""
    max_cached_turns: int = field(default=65_536, metadata=flag(metavar="N"))
    """Recorded replies kept for transport retries (``Idempotency-Key``, the OpenAI SDK's own retries; the
    oldest settled ones go first)."""
    max_partial_rollout_preempts: int | None = field(default=None, metadata=flag(metavar="N"))
    """With partial rollout: weight-version changes one session may span; a call that would record
    tokens of one more version is refused with 502 ``partial_rollout_staleness_exceeded`` (nothing
    recorded). ``None``: no limit."""

    def __post_init__(self) -> None:
        n = self.max_partial_rollout_preempts
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ConfigError(f"sessions.max_partial_rollout_preempts must be an integer >= 0, got {n!r}")
        if not self.finalize_wait_s >= 0:
            raise ConfigError(f"sessions.finalize_wait_s must be >= 0, got {self.finalize_wait_s!r}")
        if not isinstance(self.partial_rollout, bool):
            raise ConfigError(f"sessions.partial_rollout must be true or false, got {self.partial_rollout!r}")
        if not self.session_timeout_s >= 0:
            raise ConfigError(f"sessions.session_timeout_s must be >= 0, got {self.session_timeout_s!r}")
        for key in ("max_sessions", "max_cached_turns"):
            _positive_int(f"sessions.{key}", getattr(self, key))


@dataclass(kw_only=True, slots=True)
class ReadsConfig:
    """What a batch ``/trajectory/read`` hands over: whole prompt groups, or groups that waited too long.

    GRPO normalises rewards within a prompt group; a group handed over before its last sessions
    finalized trains on a partial group (and its late sessions form a second one). A read may
    override both values per call (``min_group_size``, ``group_timeout_s`` in its body).
    """

    min_group_size: int = field(default=1, metadata=flag(metavar="N"))
    """Finalized sessions a prompt group needs before a batch read hands it over (1: every group at once)."""
    group_timeout_s: float = field(default=300.0, metadata=flag("--group-timeout", metavar="S"))
    """A group whose oldest finalized session is this old is handed over with what it has (its other
    sessions were lost or aborted). After a journal replay, the age counts from the replay."""
    lease_s: float = field(default=600.0, metadata=flag("--read-lease", metavar="S"))
    """How long a leasing (or draining) read holds its trajectories for an ack (``POST /trajectory/ack``);
    past it they are readable again. A read may ask for another lease in its body (``lease_s``)."""
    record_token_versions: bool = True
    """Segment objects carry ``full_versions`` (upstream's switch; this Proxy always records versions,
    so off only leaves them out of upstream's Segment objects)."""
    mask_nonlast_version_tokens: bool = False
    """Segment objects say ``extra_info.mask_nonlast_version_tokens``: upstream's trainer then trains
    only the tokens of a Segment's last weight version (with ``full_versions``)."""

    def __post_init__(self) -> None:
        if self.mask_nonlast_version_tokens and not self.record_token_versions:
            raise ConfigError("reads.mask_nonlast_version_tokens needs reads.record_token_versions "
                              "(the trainer masks by the versions it reads)")
        _positive_int("reads.min_group_size", self.min_group_size)
        if isinstance(self.lease_s, bool) or not isinstance(self.lease_s, (int, float)) \
                or not 0 < self.lease_s < float("inf"):
            raise ConfigError(f"reads.lease_s must be a positive number of seconds, got {self.lease_s!r}")
        if isinstance(self.group_timeout_s, bool) or not isinstance(self.group_timeout_s, (int, float)) \
                or not self.group_timeout_s > 0:
            raise ConfigError(f"reads.group_timeout_s must be positive, got {self.group_timeout_s!r}")


@dataclass(kw_only=True, slots=True)
class TokenBuildConfig:
    """How a call's tokens are built (upstream's token-build flags).

    This Proxy always builds token-in-token-out: a turn's prompt extends the tokens the engine gave
    before, the chat template only renders what is new (:mod:`dressage.tokenizer`), for every family
    its tokenizer knows. Upstream's ``snapshot`` mode (re-render the whole history each turn) drifts
    tokens, so it is refused, not emulated.
    """

    mode: str = field(default="tito", metadata=flag("--token-build-mode", choices=("tito", "snapshot")))
    """``tito`` (the only mode here)."""
    model: str | None = field(default=None, metadata=flag("--token-build-model", metavar="FAMILY"))
    """Upstream's model family (``qwen3_5``, ``qwen3_6``) naming its TITO, mask and parser defaults; here
    the tokenizer decides TITO, and the family is the default of the parsers left at ``auto``."""
    tito_model: str | None = field(default=None, metadata=flag(metavar="FAMILY"))
    """Upstream's TITO family (``qwen3_5``, ``qwen3_6``); the same as ``model`` here."""
    model_mask_type: str | None = field(default=None, metadata=flag(metavar="FAMILY"))
    """Upstream's snapshot-mode assistant-mask template; unused with TITO (as upstream), accepted."""

    def __post_init__(self) -> None:
        if self.mode != "tito":
            raise ConfigError(f"token_build.mode: {self.mode!r} is not built here: this Proxy builds every turn "
                              "token-in-token-out (tito); re-rendering the history drifts tokens")
        for key in ("model", "tito_model"):
            value = getattr(self, key)
            if value is not None and value not in TOKEN_BUILD_MODELS:
                raise ConfigError(f"token_build.{key}: expected one of {', '.join(TOKEN_BUILD_MODELS)}, got {value!r}")
        if self.model is not None and self.tito_model is not None and self.model != self.tito_model:
            raise ConfigError(f"token_build.tito_model {self.tito_model!r} differs from token_build.model {self.model!r}")

    @property
    def family(self) -> str | None:
        return self.tito_model or self.model


@dataclass(kw_only=True, slots=True)
class ToolCallHooksConfig:
    """Side effects at agents' tool-call boundaries (upstream's hooks, :mod:`dressage.proxy.tool_call_hooks`)."""

    hooks: tuple[str, ...] = field(default=(), metadata=flag("--tool-call-hooks", metavar="REF"))
    """Hooks to run: ``package.module:Class``, ``/path/file.py:Class``, or the ``name`` of a hook such a
    module defines; loaded at start (a reference that loads nothing stops it)."""
    before_timeout_s: float | None = field(default=None, metadata=flag("--tool-call-hook-before-timeout",
                                                                       metavar="S"))
    """Time each ``before_tool_call`` hook has; a required one that overruns fails the call. ``None``: no limit."""

    def __post_init__(self) -> None:
        self.hooks = tuple(str(h) for h in (self.hooks or ()))
        t = self.before_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)
                              or t <= 0):
            raise ConfigError(f"tool_call_hooks.before_timeout_s must be a positive number, got {t!r}")


@dataclass(kw_only=True, slots=True)
class JournalConfig:
    """Where the Proxy journals committed steps, and when appends reach the disk."""

    path: str | None = field(default=None, metadata=flag("--journal", metavar="PATH"))
    """Append every committed step to this journal and replay it on start: a restarted Proxy resumes its
    sessions. ``None``: no journal."""
    fsync: str = field(default="always", metadata=flag("--journal-fsync", choices=FSYNC_POLICIES))
    """When journal appends reach the disk: always (before the reply), interval or never."""
    recover: str = field(default="refuse", metadata=flag("--journal-recover", choices=JOURNAL_RECOVER_MODES))
    """A journal damaged before its end (not a torn tail): ``refuse`` to start (run ``dressage proxy journal
    repair``), or ``truncate``: start on its intact prefix, the rest set aside as ``PATH.damaged-OFFSET``."""

    def __post_init__(self) -> None:
        if self.fsync not in FSYNC_POLICIES:
            raise ConfigError(f"journal.fsync: expected one of {', '.join(FSYNC_POLICIES)}, got {self.fsync!r}")
        if self.recover not in JOURNAL_RECOVER_MODES:
            raise ConfigError(f"journal.recover: expected one of {', '.join(JOURNAL_RECOVER_MODES)}, "
                              f"got {self.recover!r}")
        if self.path is not None and not str(self.path):
            raise ConfigError("journal.path: an empty path")


EXPORT_DIR_FORMATS = ("jsonl", "parquet")


@dataclass(kw_only=True, slots=True)
class TrajectoryExportConfig:
    """Where the Proxy writes each finalized trajectory as a file of its own (besides keeping it for reads)."""

    dir: str | None = field(default=None, metadata=flag("--export-dir", metavar="DIR"))
    """Write each finalized trajectory to DIR/<session id>.<format>, atomically (temporary file, then
    rename). ``None``: not written."""
    format: str = field(default="jsonl", metadata=flag("--export-format", choices=EXPORT_DIR_FORMATS))
    """One row per Segment as JSONL, or as Parquet (the 'export' extra: pyarrow)."""

    def __post_init__(self) -> None:
        if self.format not in EXPORT_DIR_FORMATS:
            raise ConfigError(f"export.format: expected one of {', '.join(EXPORT_DIR_FORMATS)}, got {self.format!r}")
        if self.dir is not None and not str(self.dir):
            raise ConfigError("export.dir: an empty path")


@dataclass(kw_only=True, slots=True)
class ProxyConfig:
    """Everything one Proxy needs; :meth:`dressage.proxy.Proxy.start` builds the Proxy from it."""

    tokenizer: str = field(default="byte", metadata=flag(metavar="NAME", aliases=("--tokenizer-path",)))
    """'byte' (built in), 'qwen3' or 'qwen3.5'/'qwen3.6' (packaged vocabularies), or a Hugging Face tokenizer path."""
    tokenizer_from_engine: bool = False
    """Without ``--tokenizer``, load the tokenizer the engine names (its model info's ``tokenizer_path``)."""
    num_layers: int | None = field(default=None, metadata=flag(metavar="N"))
    """R3 rows per token (every hidden layer SGLang captures); overrides the engine's model info and the preset."""
    topk: int | None = field(default=None, metadata=flag(metavar="K"))
    """Experts routed per token per layer; overrides the engine's model info and the preset."""
    num_experts: int | None = field(default=None, metadata=flag(metavar="N"))
    """Routed experts per layer; overrides the engine's model info and the preset."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """The HTTP listener."""
    access: AccessConfig = field(default_factory=AccessConfig)
    """Agents' and trainer's tokens."""
    engines: EnginesConfig = field(default_factory=EnginesConfig)
    """The engines behind the Proxy."""
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    """Per-call token budget and context."""
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    """Session lifetime and weight updates."""
    reads: ReadsConfig = field(default_factory=ReadsConfig)
    """Whole prompt groups on batch trajectory reads."""
    token_build: TokenBuildConfig = field(default_factory=TokenBuildConfig)
    """Upstream's token-build settings (TITO always)."""
    tool_call_hooks: ToolCallHooksConfig = field(default_factory=ToolCallHooksConfig)
    """Hooks at agents' tool-call boundaries (none by default)."""
    journal: JournalConfig = field(default_factory=JournalConfig)
    """The step journal (off unless ``journal.path`` is set)."""
    export: TrajectoryExportConfig = field(default_factory=TrajectoryExportConfig)
    """Finalized trajectories written to a directory (off unless ``export.dir`` is set)."""
    transfer_queue: TransferQueueSelection = field(default_factory=TransferQueueSelection)
    """Which TransferQueue holds the offloaded fields when the data plane turns it on."""
    data_plane: DataPlaneConfig = field(default_factory=DataPlaneConfig)
    """What is recorded (R3, dtype) and which large fields go to TransferQueue."""

    def __post_init__(self) -> None:
        for key, cls in (("server", ServerConfig), ("access", AccessConfig), ("engines", EnginesConfig),
                         ("limits", LimitsConfig), ("sessions", SessionsConfig), ("reads", ReadsConfig),
                         ("token_build", TokenBuildConfig), ("tool_call_hooks", ToolCallHooksConfig),
                         ("journal", JournalConfig), ("export", TrajectoryExportConfig),
                         ("transfer_queue", TransferQueueSelection), ("data_plane", DataPlaneConfig)):
            if not isinstance(getattr(self, key), cls):
                raise ConfigError(f"{key}: expected a {cls.__name__}, got {type(getattr(self, key)).__name__}")
        if not isinstance(self.tokenizer, str) or not self.tokenizer:
            raise ConfigError(f"tokenizer: expected 'byte' or a tokenizer path, got {self.tokenizer!r}")
        for key in ("num_layers", "topk", "num_experts"):
            _optional_positive_int(key, getattr(self, key))
        if self.access.api_token is None and not self.access.no_auth and not is_loopback(self.server.host):
            raise ConfigError(f"server.host: {self.server.host} is reachable from other machines; set an agent "
                              f"token (--api-token-file, ${AGENT_TOKEN_ENV}), bind a loopback address, or "
                              "say --no-auth")
        family = self.token_build.family
        if family is not None:  # upstream's family names the parsers it leaves to their defaults
            if self.server.tool_call_parser == AUTO:
                self.server.tool_call_parser = UPSTREAM_TOOL_CALL_TYPES[family]
            if self.server.reasoning_parser == AUTO:
                self.server.reasoning_parser = UPSTREAM_REASONING_TYPES[family]
        if self.sessions.max_partial_rollout_preempts is not None and not self.sessions.partial_rollout:
            raise ConfigError("sessions.max_partial_rollout_preempts (--max-partial-rollout-preempts): set, but "
                              "sessions.partial_rollout (--partial-rollout) is off")
        if not self.data_plane.enable_transfer_queue:
            self.transfer_queue.require_enabled()


_ENV_FLAGS = {"", "0", "false", "no", "off"}


def upstream_environment(environ: Mapping[str, str], given: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted settings from upstream Dressage's ``DRESSAGE_*`` variables, for those ``given`` (the nested
    map of what flags and ``--config`` set) leaves unset; flags win, as upstream's.

    ``DRESSAGE_ENABLE_TRANSFER_QUEUE`` (a switch), and with TransferQueue on
    ``DRESSAGE_TRANSFER_QUEUE_CONFIG``, ``DRESSAGE_TRANSFER_QUEUE_RETENTION_SECONDS`` and
    ``DRESSAGE_TRANSFER_PARAMS`` (names split on spaces or commas); ``DRESSAGE_PROXY_MAX_STEPS_PER_SESSION``
    (0: no limit). A malformed value is a ``ConfigError`` naming the variable.
    """
    def unset(path: str) -> bool:
        node: Any = given
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return True
            node = node[part]
        return node is None

    def number(name: str, kind: type) -> Any:
        try:
            value = kind(environ[name])
        except ValueError:
            raise ConfigError(f"${name}: expected a number, got {environ[name]!r}") from None
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"${name}: expected a finite number >= 0, got {environ[name]!r}")
        return value

    out: dict[str, Any] = {}
    if unset("data_plane.enable_transfer_queue") and "DRESSAGE_ENABLE_TRANSFER_QUEUE" in environ:
        out["data_plane.enable_transfer_queue"] = \
            environ["DRESSAGE_ENABLE_TRANSFER_QUEUE"].strip().lower() not in _ENV_FLAGS
    tq_on = out.get("data_plane.enable_transfer_queue",
                    (given.get("data_plane") or {}).get("enable_transfer_queue", False))
    if tq_on:
        if unset("transfer_queue.config") and environ.get("DRESSAGE_TRANSFER_QUEUE_CONFIG"):
            out["transfer_queue.config"] = environ["DRESSAGE_TRANSFER_QUEUE_CONFIG"]
        if unset("transfer_queue.retention_s") and environ.get("DRESSAGE_TRANSFER_QUEUE_RETENTION_SECONDS"):
            out["transfer_queue.retention_s"] = number("DRESSAGE_TRANSFER_QUEUE_RETENTION_SECONDS", float)
        names = environ.get("DRESSAGE_TRANSFER_PARAMS", "").replace(",", " ").split()
        if unset("data_plane.transfer_params") and names:
            out["data_plane.transfer_params"] = tuple(names)
    if unset("limits.max_steps_per_session") and environ.get("DRESSAGE_PROXY_MAX_STEPS_PER_SESSION"):
        steps = number("DRESSAGE_PROXY_MAX_STEPS_PER_SESSION", int)
        if steps:
            out["limits.max_steps_per_session"] = steps
    return out


def environment_overrides(environ: Mapping[str, str], given: Mapping[str, Any]) -> dict[str, Any]:
    """Every dotted setting the environment gives where ``given`` (flags and ``--config``) leaves it unset:
    the tokens (``$DRESSAGE_PROXY_TOKEN``, ``$DRESSAGE_ADMIN_TOKEN``: arguments show in ``ps``, the
    environment does not) and upstream's variables (:func:`upstream_environment`)."""
    access = given.get("access") or {}
    out = upstream_environment(environ, given)
    for key, env in (("api_token", AGENT_TOKEN_ENV), ("admin_token", ADMIN_TOKEN_ENV)):
        if access.get(key) is None and access.get(key + "_file") is None and environ.get(env):
            out["access." + key] = environ[env]
    return out
