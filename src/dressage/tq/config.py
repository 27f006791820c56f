"""TransferQueueConfig: every TransferQueue setting, validated once at the edge.

Loaded from YAML (``--transfer-queue-config FILE``; the keys may sit under a top-level
``transfer_queue:`` map) or built in code. Bad keys and values raise ConfigError naming the dotted key.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from dressage.errors import ConfigError
from dressage.flags import flag, load_yaml
from dressage.units import parse_bytes

__all__ = ["TransferQueueConfig", "TransferQueueSelection", "tq_default", "DEPLOYMENTS", "ON_FULL", "load_config",
           "EXAMPLE_CONFIG", "SECRET_ENV",
           "is_loopback", "check_spill_dir", "MAX_WAIT_S", "MAX_RETENTION_S", "MAX_UNIT_MEMORY_BUDGET"]

DEPLOYMENTS = ("embedded", "local", "ray", "transferqueue")
ON_FULL = ("spill", "wait", "error")
_PREFIX = "transfer_queue"
# The shipped example (the same text as examples/transfer_queue.yaml), readable from an installed wheel.
EXAMPLE_CONFIG = Path(__file__).resolve().with_name("transfer_queue.yaml")
# Where the shared secret comes from when ``auth_secret`` is not in the config (keeps it out of files).
SECRET_ENV = "DRESSAGE_TQ_SECRET"
_MIN_SECRET = 16
# Upper bounds no real setting comes near: past them, timeouts overflow the clocks and socket options
# they end up in (a thread's wait, ZMQ's int32 milliseconds).
MAX_WAIT_S = 7 * 86400.0
"""The longest timeout, wait or probe interval: a week."""
MAX_RETENTION_S = 365 * 86400.0
"""The longest ``retention_s``: a year."""
MAX_UNIT_MEMORY_BUDGET = 1 << 50
"""The largest ``unit_memory_budget``: 1 PiB."""


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` exposes sockets to this machine only."""
    if host in ("localhost", "::1"):
        return True
    parts = host.split(".")
    return len(parts) == 4 and parts[0] == "127" and all(p.isdigit() for p in parts)


@dataclass(kw_only=True, slots=True)
class TransferQueueConfig:
    """Where StorageUnits run, how much memory each may hold, and what happens when one is full."""

    deployment: str = "embedded"
    """``embedded`` (one process, the default), ``local`` (Controller and StorageUnits as processes on
    this host), ``ray`` (one StorageUnit actor per node, the head excepted, and the Controller as a
    process beside the driver) or ``transferqueue`` (the payload in a public TransferQueue on Ray, PyPI
    ``transferqueue``, in upstream Dressage's step layout; see docs/transferqueue.md)."""
    num_storage_units: int | None = None
    """Number of StorageUnits; ``None`` means 1 for embedded/local and one per alive node for ray."""
    head_storage_unit: bool = False
    """ray: whether the head node gets StorageUnits too when other nodes are alive. ``false`` (default):
    units go round robin over the other nodes only, so the head (Controller, Proxy, RolloutManager)
    holds no payload and no unit process; ``true``: over every node, the head's unit taking payload
    only when no other live unit has room. A one-node cluster always has its unit on the head."""
    unit_memory_budget: int | str = "4GiB"
    """Payload bytes one StorageUnit holds in memory (``"4GiB"``, ``512MiB``, or an int)."""
    on_full: str = "spill"
    """A put that does not fit the budget: ``spill`` to ``spill_dir``, ``wait`` up to ``full_wait_s``
    for space (then StorageFullError), or ``error`` at once."""
    spill_dir: str | None = None
    """Directory for spilled blobs (one subdirectory per unit); ``None``: a temporary directory."""
    full_wait_s: float = 30.0
    """How long a put waits for space when ``on_full: wait``."""
    retention_s: float | None = 3600.0
    """Keys nobody holds are removed this long after their last write, consuming read or renewal; ``None``
    keeps them until cleared. A safety net for keys nobody will read: the Proxy renews the keys of every
    session it holds (live, or finalized and not yet acknowledged) every ``retention_s / 4``, and once more
    when a trainer acknowledges them, which then has ``retention_s`` to restore them."""
    host: str = "127.0.0.1"
    """Address ZMQ sockets bind to; use ``0.0.0.0`` on a real multi-host Ray cluster."""
    controller_port: int = 0
    """Controller port (local/ray, or embedded once exposed); 0 picks a free port."""
    unit_base_port: int = 0
    """StorageUnit ``i`` binds ``unit_base_port + i``; 0 picks free ports."""
    shared_memory: bool = True
    """Between processes on one host, move payloads of 256 KiB and more through /dev/shm."""
    request_timeout_s: float = 30.0
    """A StorageUnit or Controller that does not answer within this is StorageUnitUnavailable."""
    startup_timeout_s: float = 60.0
    """How long ``TransferQueue.start`` waits for processes or actors to come up."""
    ray_address: str | None = None
    """``ray.init(address=...)`` when Ray is not initialised yet; ``None`` starts or joins a local one."""
    checksums: bool = True
    """Per-row-block xxh3-64 checksums, computed on put and verified on every read (a corrupted blob
    is IntegrityError). The hash runs on each block right after it is copied in; ``false`` only to measure."""
    verify_local_reads: bool = False
    """embedded: also verify the checksums when the in-process client reads a blob the unit copied into
    its own read-only memory. ``false`` (default): those reads are read-only views of bytes nothing else
    can write, so they are not hashed again on every get; everything that crosses a process or host
    boundary (a unit serving another process, /dev/shm segments, received frames) and every spill file
    read is verified regardless. ``true`` also catches bytes corrupted in this process's own memory."""
    heartbeat_interval_s: float = 1.0
    """How often the Controller probes each StorageUnit process (local and ray deployments)."""
    unit_dead_after_s: float = 5.0
    """A unit that has answered no probe for this long is marked dead: no new keys, reads of its keys
    fail at once. It is live again at its next answer (a stopped process that resumed)."""
    auth_secret: str | None = None
    """Shared secret (at least 16 characters) keying the MAC of every message; ``None`` reads
    ``$DRESSAGE_TQ_SECRET``, and when that is unset too a deployment generates one of its own
    (written 0600, handed to its processes, actors and ``client_spec()``)."""
    authenticate: bool = True
    """A MAC on every message, on loopback too. ``false`` serves unauthenticated frames (loopback only)."""
    store_id: str | None = None
    """transferqueue: the store whose partition ``dressage:{store_id}:steps`` holds the Steps (keys
    ``{store_id}:{trajectory_id}:{incarnation_id}:step:{i}``); ``None``: a random id per deployment."""
    metrics_port: int | None = None
    """Prometheus ``/metrics`` of the Controller and of each StorageUnit process (local and ray), bound on
    ``host``: ``None`` (the default) serves none; ``0`` serves each on a free port (listed by
    ``TransferQueue.metrics_urls()``); ``N`` the Controller on ``N`` and StorageUnit ``i`` on ``N + 1 + i``.
    An embedded deployment's units are shown by the Proxy's own ``/metrics``."""
    log_format: str = "text"
    """Log lines of the Controller and StorageUnit processes: ``text`` or ``json`` (one object a line)."""

    def __post_init__(self) -> None:
        _choice("deployment", self.deployment, DEPLOYMENTS)
        _choice("on_full", self.on_full, ON_FULL)
        if self.num_storage_units is not None:
            _int("num_storage_units", self.num_storage_units, lo=1, hi=4096)
        if not isinstance(self.head_storage_unit, bool):
            raise ConfigError(f"{_PREFIX}.head_storage_unit: expected true or false, got {self.head_storage_unit!r}")
        self.unit_memory_budget = parse_bytes(self.unit_memory_budget, f"{_PREFIX}.unit_memory_budget")
        if self.unit_memory_budget > MAX_UNIT_MEMORY_BUDGET:
            raise ConfigError(f"{_PREFIX}.unit_memory_budget: at most 1 PiB ({MAX_UNIT_MEMORY_BUDGET} bytes), "
                              f"got {self.unit_memory_budget}")
        if self.spill_dir is not None and not isinstance(self.spill_dir, (str, os.PathLike)):
            raise ConfigError(f"{_PREFIX}.spill_dir: expected a path, got {self.spill_dir!r}")
        if self.spill_dir is not None:
            self.spill_dir = os.fspath(self.spill_dir)
            if not isinstance(self.spill_dir, str) or not self.spill_dir or "\0" in self.spill_dir:
                raise ConfigError(f"{_PREFIX}.spill_dir: expected a directory path, got {self.spill_dir!r}")
        self.full_wait_s = _seconds("full_wait_s", self.full_wait_s, allow_zero=True)
        if self.retention_s is not None:
            self.retention_s = _seconds("retention_s", self.retention_s, hi=MAX_RETENTION_S)
        if not isinstance(self.shared_memory, bool):
            raise ConfigError(f"{_PREFIX}.shared_memory: expected true or false, got {self.shared_memory!r}")
        self.request_timeout_s = _seconds("request_timeout_s", self.request_timeout_s)
        self.startup_timeout_s = _seconds("startup_timeout_s", self.startup_timeout_s)
        if isinstance(self.host, str) and ":" in self.host and not any(c in self.host for c in " /"):
            raise ConfigError(f"{_PREFIX}.host: {self.host!r} is an IPv6 address, which the TransferQueue's "
                              "sockets do not support; use an IPv4 address (127.0.0.1 for this machine only) "
                              "or a host name")
        if not isinstance(self.host, str) or not self.host or any(c in self.host for c in " /:"):
            raise ConfigError(f"{_PREFIX}.host: expected a host name or IP address, got {self.host!r}")
        _int("controller_port", self.controller_port, lo=0, hi=65535)
        _int("unit_base_port", self.unit_base_port, lo=0, hi=65535)
        if self.metrics_port is not None:
            _int("metrics_port", self.metrics_port, lo=0, hi=65535)
        self.check_ports(self.num_storage_units or 1)
        _choice("log_format", self.log_format, ("text", "json"))
        if self.ray_address is not None and not isinstance(self.ray_address, str):
            raise ConfigError(f"{_PREFIX}.ray_address: expected a string, got {self.ray_address!r}")
        if not isinstance(self.checksums, bool):
            raise ConfigError(f"{_PREFIX}.checksums: expected true or false, got {self.checksums!r}")
        if not isinstance(self.verify_local_reads, bool):
            raise ConfigError(f"{_PREFIX}.verify_local_reads: expected true or false, "
                              f"got {self.verify_local_reads!r}")
        self.heartbeat_interval_s = _seconds("heartbeat_interval_s", self.heartbeat_interval_s)
        self.unit_dead_after_s = _seconds("unit_dead_after_s", self.unit_dead_after_s)
        if self.unit_dead_after_s < self.heartbeat_interval_s:
            raise ConfigError(f"{_PREFIX}.unit_dead_after_s: must be >= heartbeat_interval_s "
                              f"({self.heartbeat_interval_s:g}), got {self.unit_dead_after_s:g}")
        if self.auth_secret is not None and (not isinstance(self.auth_secret, str)
                                             or len(self.auth_secret) < _MIN_SECRET):
            raise ConfigError(f"{_PREFIX}.auth_secret: expected a string of at least {_MIN_SECRET} characters")
        if self.store_id is not None and (not isinstance(self.store_id, str) or not self.store_id
                                          or ":" in self.store_id):
            raise ConfigError(f"{_PREFIX}.store_id: expected a non-empty string without ':', got {self.store_id!r}")
        if not isinstance(self.authenticate, bool):
            raise ConfigError(f"{_PREFIX}.authenticate: expected true or false, got {self.authenticate!r}")
        if not self.authenticate and self.auth_secret is not None:
            raise ConfigError(f"{_PREFIX}.authenticate: false, but auth_secret is set")
        if not self.authenticate and not is_loopback(self.host):
            raise ConfigError(f"{_PREFIX}.authenticate: false is only allowed on a loopback host, not {self.host!r}")
        if not is_loopback(self.host) and self.secret is None:
            raise ConfigError(
                f"{_PREFIX}.host: {self.host!r} is not a loopback address, so every frame must be "
                f"authenticated: set {_PREFIX}.auth_secret or ${SECRET_ENV} (at least {_MIN_SECRET} characters)")

    def check_ports(self, units: int) -> None:
        """ConfigError when ``units`` StorageUnits would be given ports past 65535: unit ``i`` binds
        ``unit_base_port + i`` and serves metrics on ``metrics_port + 1 + i``. Checked with
        ``num_storage_units`` here, and by a ray deployment once it knows how many nodes it has."""
        if self.unit_base_port and self.unit_base_port + units - 1 > 65535:
            raise ConfigError(f"{_PREFIX}.unit_base_port: {units} StorageUnit(s) bind ports {self.unit_base_port} to "
                              f"{self.unit_base_port + units - 1}, past 65535; use at most {65536 - units}")
        if self.metrics_port and self.metrics_port + units > 65535:
            raise ConfigError(f"{_PREFIX}.metrics_port: the Controller and {units} StorageUnit(s) serve metrics on "
                              f"ports {self.metrics_port} to {self.metrics_port + units}, past 65535; use at most "
                              f"{65535 - units}")

    @property
    def budget_bytes(self) -> int:
        return int(self.unit_memory_budget)

    @property
    def secret(self) -> bytes | None:
        """The configured HMAC key: ``auth_secret``, else ``$DRESSAGE_TQ_SECRET``, else None (a deployment
        then generates one, unless ``authenticate`` is false)."""
        if not self.authenticate:
            return None
        text = self.auth_secret if self.auth_secret is not None else os.environ.get(SECRET_ENV) or None
        if text is None:
            return None
        if len(text) < _MIN_SECRET:
            raise ConfigError(f"${SECRET_ENV}: expected at least {_MIN_SECRET} characters")
        return text.encode()

    def replace(self, **changes: Any) -> "TransferQueueConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "TransferQueueConfig":
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError(f"{_PREFIX}: expected a mapping, got {type(data).__name__}")
        if set(data) == {_PREFIX}:
            data = data[_PREFIX] or {}
            if not isinstance(data, Mapping):
                raise ConfigError(f"{_PREFIX}: expected a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                raise ConfigError(f"{_PREFIX}.{key}: unknown key (known: {', '.join(sorted(known))})")
        return cls(**dict(data))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> "TransferQueueConfig":
        return cls.from_dict(load_yaml(path, what=_PREFIX))


@dataclass(kw_only=True, slots=True)
class TransferQueueSelection:
    """Which TransferQueue a command uses: the deployment it starts, or a running one it joins."""

    config: "TransferQueueConfig | str | None" = field(
        default=None, metadata=flag("--transfer-queue-config", metavar="FILE", parse=str))
    """The deployment to start: its YAML file (see ``examples/transfer_queue.yaml``), its settings as
    a map, or a TransferQueueConfig; none: the embedded defaults."""
    spec: str | None = field(default=None, metadata=flag("--transfer-queue-spec", metavar="FILE"))
    """Join the running TransferQueue whose client spec this file holds (``TransferQueue.write_client_spec``)
    instead of starting one: the Proxy then needs no Ray, even for a TQ deployed on Ray."""
    spec_out: str | None = field(default=None, metadata=flag("--transfer-queue-spec-out", metavar="FILE"))
    """Write the client spec of the TransferQueue in use to this file (JSON, mode 0600: it carries the
    TQ's secret) once it runs, for processes that join it by file; the command removes it when it stops."""
    retention_s: float | None = field(default=None, metadata=flag("--transfer-queue-retention-seconds", metavar="S"))
    """Overrides the started deployment's ``retention_s``: keys nobody holds are removed this long after
    their last write, consuming read or renewal (the Proxy renews its sessions' keys). ``None``: the
    deployment's own setting."""

    def __post_init__(self) -> None:
        if self.retention_s is not None:
            self.retention_s = _seconds("retention_s", self.retention_s, hi=MAX_RETENTION_S)
            if self.spec is not None:
                raise ConfigError("transfer_queue.retention_s (--transfer-queue-retention-seconds) applies to a "
                                  "TransferQueue this command starts, not one joined with transfer_queue.spec")
        if isinstance(self.config, Mapping):
            self.config = TransferQueueConfig.from_dict(self.config)
        elif isinstance(self.config, os.PathLike):
            self.config = os.fspath(self.config)
        if self.config is not None and not isinstance(self.config, (TransferQueueConfig, str)) \
                or self.config == "":
            raise ConfigError(f"transfer_queue.config: expected a YAML file or settings, got {self.config!r}")
        if self.spec is not None:
            if not isinstance(self.spec, str) or not self.spec:
                raise ConfigError(f"transfer_queue.spec: expected a file path, got {self.spec!r}")
            if self.config is not None:
                raise ConfigError("transfer_queue.spec (--transfer-queue-spec) joins a running TransferQueue; it "
                                  "cannot go with transfer_queue.config (--transfer-queue-config), which starts one")
        if self.spec_out is not None:
            if isinstance(self.spec_out, os.PathLike):
                self.spec_out = os.fspath(self.spec_out)
            if not isinstance(self.spec_out, str) or not self.spec_out:
                raise ConfigError(f"transfer_queue.spec_out: expected a file path, got {self.spec_out!r}")
            if self.spec is not None and os.path.abspath(self.spec_out) == os.path.abspath(self.spec):
                raise ConfigError("transfer_queue.spec_out (--transfer-queue-spec-out) names the file "
                                  "transfer_queue.spec (--transfer-queue-spec) joins from")

    def require_enabled(self) -> None:
        """Raise :class:`ConfigError` naming the first setting given: called when TQ is off, where each
        of them would be silently ignored."""
        for key, name in (("config", "config"), ("spec", "spec"), ("spec_out", "spec-out"),
                          ("retention_s", "retention-seconds")):
            if getattr(self, key) is not None:
                raise ConfigError(f"transfer_queue.{key} (--transfer-queue-{name}): set, but "
                                  "data_plane.enable_transfer_queue (--enable-transfer-queue) is off")

    def settings(self) -> TransferQueueConfig:
        """The settings of the deployment to start (the file read now, ``retention_s`` applied)."""
        cfg = load_config(self.config)
        return cfg if self.retention_s is None else dataclasses.replace(cfg, retention_s=self.retention_s)


def tq_default(name: str) -> Any:
    """The default of TransferQueueConfig's setting ``name``, for the processes a deployment launches
    with it (their flags' defaults are these, declared once, here)."""
    return next(f.default for f in dataclasses.fields(TransferQueueConfig) if f.name == name)


def load_config(source: "TransferQueueConfig | Mapping[str, Any] | str | os.PathLike[str] | None") -> TransferQueueConfig:
    """Accept a config, a mapping, a YAML path, or ``None`` (defaults)."""
    if isinstance(source, TransferQueueConfig):
        return source
    if source is None or isinstance(source, Mapping):
        return TransferQueueConfig.from_dict(source)
    return TransferQueueConfig.from_yaml(source)


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{_PREFIX}.{name}: expected one of {', '.join(allowed)}, got {value!r}")


def _int(name: str, value: Any, *, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{_PREFIX}.{name}: expected an integer in [{lo}, {hi}], got {value!r}")


def _seconds(name: str, value: Any, *, allow_zero: bool = False, hi: float = MAX_WAIT_S) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{_PREFIX}.{name}: expected seconds as a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{_PREFIX}.{name}: must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    if value > hi:
        raise ConfigError(f"{_PREFIX}.{name}: at most {hi:g} s ({_span(hi)}), got {value!r}")
    return float(value)


def _span(seconds: float) -> str:
    days = seconds / 86400
    return "a week" if days == 7 else "a year" if days == 365 else f"{days:g} days"


def check_spill_dir(path: str) -> None:
    """ConfigError naming ``transfer_queue.spill_dir`` unless ``path`` is a directory this process can
    create (it is made, with its parents, 0700) and write a file in: checked when a deployment whose
    units spill on this host starts, before anything is started."""
    where = f"{_PREFIX}.spill_dir"
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{where}: {path!r} exists and is not a directory")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".dressage-spill-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot create or write to the directory {path!r}: "
                          f"{exc.strerror or exc}") from None
