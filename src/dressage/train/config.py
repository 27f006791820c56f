"""``TrainerConfig``: the standalone trainer process (``dressage trainer``), validated once at the edge.

It is the command's config tree (:mod:`dressage.flags`): which Proxy to drain, how the batch is
sharded and read, and where the report goes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dressage.errors import ConfigError
from dressage.flags import flag
from dressage.train.reader import LOST_POLICIES

__all__ = ["TrainerConfig", "TrainerProxyConfig", "MAX_TIMEOUT_S"]

MAX_TIMEOUT_S = 7 * 86400.0


@dataclass(kw_only=True, slots=True)
class TrainerProxyConfig:
    """The running Proxy whose trajectories this trainer drains."""

    url: str = field(metadata=flag("--proxy-url", metavar="URL"))
    """The Proxy, e.g. http://127.0.0.1:8000."""
    admin_token_file: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """File holding the Proxy's admin token (the token alone, stripped; an empty file is refused); else
    $DRESSAGE_ADMIN_TOKEN, else none."""

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"proxy.url: expected http(s)://host:port, got {self.url!r}")


@dataclass(kw_only=True, slots=True)
class TrainerConfig:
    """One trainer run: drain the Proxy, shard by DP rank, restore from its TransferQueue, check."""

    dp_size: int = field(default=1, metadata=flag(metavar="N"))
    """Data-parallel ranks to shard the batch over."""
    expect_sessions: int | None = field(default=None, metadata=flag(metavar="N"))
    """Read until this many trajectories arrived (none: one read)."""
    timeout_s: float = field(default=60.0, metadata=flag("--timeout", metavar="S"))
    """Seconds to wait for them."""
    on_lost: str = field(default="fail", metadata=flag(choices=LOST_POLICIES))
    """What to do with Samples whose StorageUnit lost their fields."""
    json: str | None = field(default=None, metadata=flag(metavar="FILE"))
    """Write the report as JSON here."""
    proxy: TrainerProxyConfig
    """The Proxy to drain."""

    def __post_init__(self) -> None:
        if isinstance(self.dp_size, bool) or not isinstance(self.dp_size, int) or self.dp_size < 1:
            raise ConfigError(f"dp_size must be a positive integer, got {self.dp_size!r}")
        if self.on_lost not in LOST_POLICIES:
            raise ConfigError(f"on_lost: expected one of {', '.join(LOST_POLICIES)}, got {self.on_lost!r}")
        if self.expect_sessions is not None and (isinstance(self.expect_sessions, bool)
                                                 or not isinstance(self.expect_sessions, int)
                                                 or self.expect_sessions < 1):
            raise ConfigError(f"expect_sessions (--expect-sessions): expected a positive integer, "
                              f"got {self.expect_sessions!r}")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) \
                or not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise ConfigError(f"timeout_s (--timeout): expected seconds in (0, {MAX_TIMEOUT_S:g}] (a week), "
                              f"got {self.timeout_s!r}")
        if self.json is not None and (not isinstance(self.json, str) or not self.json):
            raise ConfigError(f"json (--json): expected a file path, got {self.json!r}")
