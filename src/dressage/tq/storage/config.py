"""``UnitProcessConfig``: one StorageUnit process (``python -m dressage.tq.storage.server``).

The process's config tree (:mod:`dressage.flags`): the unit's backend settings and, in the
``server`` section, the sockets that serve it. The launcher (:mod:`dressage.tq.deploy.local`) writes
the flags; ``$DRESSAGE_TQ_SECRET`` keys the MACs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dressage.errors import ConfigError
from dressage.flags import flag
from dressage.tq.config import ON_FULL, tq_default

__all__ = ["UnitProcessConfig", "UnitServerConfig", "UNIT_MAX_MESSAGE", "UNIT_ZMQ_MAX_MESSAGE"]

UNIT_MAX_MESSAGE = 1 << 34  # 16 GiB: the largest put a unit reads from one peer
# libzmq buffers a whole frame before the MAC can be checked, so a unit with a bulk stream (which
# authenticates a message's head before it allocates) takes on ZMQ only what clients send there: a
# control frame (at most 16 MiB) and small payloads (under ``remote.BULK_MIN_BYTES``).
UNIT_ZMQ_MAX_MESSAGE = 17 << 20


@dataclass(kw_only=True, slots=True)
class UnitServerConfig:
    """The sockets of the unit: address, same-host shared memory, largest message."""

    host: str = tq_default("host")
    """Address to bind."""
    port: int = 0
    """Port to bind; 0 picks a free one."""
    shared_memory: bool = field(default=tq_default("shared_memory"), metadata=flag("--no-shared-memory"))
    """Move large payloads of same-host peers through /dev/shm."""
    shm_token: str | None = field(default=None, metadata=flag(metavar="TOKEN"))
    """Token naming this deployment's /dev/shm segments."""
    max_message_bytes: int = field(default=UNIT_MAX_MESSAGE, metadata=flag(metavar="N"))
    """The largest message the unit reads from one peer (ZMQ_MAXMSGSIZE)."""

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"server.port: {self.port!r} is not a port")
        if isinstance(self.max_message_bytes, bool) or not isinstance(self.max_message_bytes, int) \
                or self.max_message_bytes < 1:
            raise ConfigError(f"server.max_message_bytes must be a positive integer, got {self.max_message_bytes!r}")


@dataclass(kw_only=True, slots=True)
class UnitProcessConfig:
    """One StorageUnit process: the backend it serves and how."""

    unit_id: str = field(metadata=flag(metavar="ID"))
    """The unit's id in the Controller's directory."""
    node_id: str | None = field(default=None, metadata=flag(metavar="ID"))
    """The node the unit runs on."""
    memory_budget: int = field(metadata=flag(metavar="BYTES"))
    """Payload bytes the unit holds in memory."""
    on_full: str = field(default=tq_default("on_full"), metadata=flag(choices=ON_FULL))
    """A put that does not fit the budget: spill, wait or error."""
    spill_dir: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """Directory for spilled blobs; none: a temporary directory."""
    checksums: bool = field(default=tq_default("checksums"), metadata=flag("--no-checksums"))
    """Per-row-block checksums, computed on put and verified on read."""
    server: UnitServerConfig = field(default_factory=UnitServerConfig)
    """The unit's sockets."""
    metrics_port: int | None = field(default=None, metadata=flag(metavar="PORT"))
    """Serve Prometheus ``/metrics`` on this port (0: a free one, named on the READY line); none: no metrics."""
    log_format: str = field(default="text", metadata=flag(choices=("text", "json")))
    """Log lines as text or as one JSON object a line."""

    def __post_init__(self) -> None:
        if not isinstance(self.unit_id, str) or not self.unit_id:
            raise ConfigError(f"unit_id: expected a name, got {self.unit_id!r}")
        if isinstance(self.memory_budget, bool) or not isinstance(self.memory_budget, int) or self.memory_budget < 0:
            raise ConfigError(f"memory_budget must be a non-negative integer, got {self.memory_budget!r}")
        if self.metrics_port is not None and (isinstance(self.metrics_port, bool) or not isinstance(
                self.metrics_port, int) or not 0 <= self.metrics_port <= 65535):
            raise ConfigError(f"metrics_port: {self.metrics_port!r} is not a port")
        if self.on_full not in ON_FULL:
            raise ConfigError(f"on_full: expected one of {', '.join(ON_FULL)}, got {self.on_full!r}")
