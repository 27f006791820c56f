"""``ProxyServerConfig``: the HTTP Proxy's one validated configuration (flags of ``dressage proxy serve``).

Re-exported by :mod:`dressage.proxy.server`; every value is checked once here, with its key
in the message, so nothing downstream re-validates.
"""

from __future__ import annotations

from dataclasses import dataclass

from dressage.errors import ConfigError

__all__ = ["ProxyServerConfig"]


def _url_ok(url: object) -> bool:
    return isinstance(url, str) and url.startswith(("http://", "https://"))


@dataclass(kw_only=True, slots=True)
class ProxyServerConfig:
    """HTTP side of the Proxy."""

    host: str = "127.0.0.1"
    """Bind address; loopback unless the agents run elsewhere."""
    port: int = 0
    """Port; 0 picks a free one."""
    engine_url: str = "http://127.0.0.1:30000"
    """SGLang (or the built-in engine) base URL; the first of ``engine_urls`` when those are given."""
    engine_urls: tuple[str, ...] = ()
    """Several engines (``--engine-url`` repeated); sessions stick to one by consistent hashing."""
    api_token: str | None = None
    """When set, every endpoint but /health needs ``Authorization: Bearer <token>``."""
    served_model_name: str = "dressage-policy"
    """``model`` reported in OpenAI responses and ``/v1/models``."""
    request_timeout_s: float = 600.0
    """Time-out of one engine call (a 504 to the agent when exceeded)."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Larger request bodies get 413."""
    default_max_tokens: int = 1024
    """max_new_tokens when a request gives no max_tokens."""
    context_window: int | None = None
    """Prompt + reply tokens one call may use: max new tokens are clamped to what is left, and a
    prompt that already fills it gets ``context_overflow`` (nothing recorded). ``None``: no limit."""
    max_output_tokens: int | None = None
    """Cap on any call's new tokens, whatever the request asks."""
    max_steps_per_session: int | None = None
    """Calls one session may record; the next gets ``max_steps_exceeded``. ``None``: no limit."""
    partial_rollout: bool = False
    """Keep generations cut by a pause and resume them under the new weights (one response,
    per-token versions). Off: such a call, and any trajectory whose weight version changes, is rejected."""
    health_check_interval_s: float = 5.0
    """Seconds between engine health checks when there are several engines (0: no checks)."""
    health_check_failures: int = 1
    """Consecutive failed health checks that take an engine out of the pool."""

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"proxy.port: {self.port!r} is not a port")
        self.engine_urls = tuple(self.engine_urls or ())
        for i, url in enumerate(self.engine_urls):
            if not _url_ok(url):
                raise ConfigError(f"proxy.engine_urls[{i}]: expected http(s)://host:port, got {url!r}")
        if len({u.rstrip("/") for u in self.engine_urls}) != len(self.engine_urls):
            raise ConfigError(f"proxy.engine_urls: an engine is listed twice: {list(self.engine_urls)}")
        if self.engine_urls:
            self.engine_url = self.engine_urls[0]
        if not _url_ok(self.engine_url):
            raise ConfigError(f"proxy.engine_url: expected http(s)://host:port, got {self.engine_url!r}")
        for key in ("request_timeout_s", "max_body_bytes", "default_max_tokens"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"proxy.{key} must be positive, got {getattr(self, key)!r}")
        for key in ("context_window", "max_output_tokens", "max_steps_per_session"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"proxy.{key} must be a positive integer or unset, got {value!r}")
        if not isinstance(self.partial_rollout, bool):
            raise ConfigError(f"proxy.partial_rollout must be true or false, got {self.partial_rollout!r}")
        if self.health_check_interval_s < 0:
            raise ConfigError(f"proxy.health_check_interval_s must be >= 0, got {self.health_check_interval_s!r}")
        if isinstance(self.health_check_failures, bool) or not isinstance(self.health_check_failures, int) \
                or self.health_check_failures < 1:
            raise ConfigError(f"proxy.health_check_failures must be an integer >= 1, got {self.health_check_failures!r}")

    @property
    def engines(self) -> tuple[str, ...]:
        """Every engine URL, in the order given."""
        return self.engine_urls or (self.engine_url,)
