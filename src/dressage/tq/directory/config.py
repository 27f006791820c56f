"""``ControllerProcessConfig``: the Controller process (``python -m dressage.tq.directory.main``).

The process's config tree (:mod:`dressage.flags`): its units, its socket, the key sweep and the
liveness probes. The launcher (:mod:`dressage.tq.deploy.local`) writes the flags from a
TransferQueueConfig.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dressage.errors import ConfigError
from dressage.flags import flag
from dressage.tq.config import tq_default

__all__ = ["ControllerProcessConfig", "ControllerLivenessConfig"]


def _seconds(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{key} must be a positive number of seconds, got {value!r}")


@dataclass(kw_only=True, slots=True)
class ControllerLivenessConfig:
    """How the Controller talks to its units and decides one is dead."""

    timeout_s: float = tq_default("request_timeout_s")
    """A unit that does not answer a request within this is unavailable."""
    heartbeat_s: float = tq_default("heartbeat_interval_s")
    """Seconds between two probes of each unit."""
    dead_after_s: float = tq_default("unit_dead_after_s")
    """A unit that answered no probe for this long is marked dead."""

    def __post_init__(self) -> None:
        for key in ("timeout_s", "heartbeat_s", "dead_after_s"):
            _seconds(f"liveness.{key}", getattr(self, key))


@dataclass(kw_only=True, slots=True)
class ControllerProcessConfig:
    """The Controller: the directory of keys over its units."""

    units: str = field(metadata=flag(metavar="JSON"))
    """JSON list of UnitInfo wire dicts (with addresses); '-' reads it as one line from stdin."""
    host: str = tq_default("host")
    """Address to bind."""
    port: int = 0
    """Port to bind; 0 picks a free one."""
    retention_s: float | None = field(default=None, metadata=flag(metavar="S"))
    """Keys nobody holds are removed this long after their last write, consuming read or renewal
    (``touch``); none keeps them."""
    sweep_s: float = field(default=1.0, metadata=flag(metavar="S"))
    """Seconds between two sweeps of deleted and expired keys."""
    strict_budget: bool = False
    """Refuse to place keys that fit no live unit's budget (StorageFullError), so with ``on_full: wait|error``
    a writer learns it must wait before it sends any payload."""
    liveness: ControllerLivenessConfig = field(default_factory=ControllerLivenessConfig)
    """Requests and probes to the units."""
    metrics_port: int | None = field(default=None, metadata=flag(metavar="PORT"))
    """Serve Prometheus ``/metrics`` on this port (0: a free one, named on the READY line); none: no metrics."""
    log_format: str = field(default="text", metadata=flag(choices=("text", "json")))
    """Log lines as text or as one JSON object a line."""

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port: {self.port!r} is not a port")
        _seconds("sweep_s", self.sweep_s)
        if self.metrics_port is not None and (isinstance(self.metrics_port, bool) or not isinstance(
                self.metrics_port, int) or not 0 <= self.metrics_port <= 65535):
            raise ConfigError(f"metrics_port: {self.metrics_port!r} is not a port")
        if self.retention_s is not None:
            _seconds("retention_s", self.retention_s)
