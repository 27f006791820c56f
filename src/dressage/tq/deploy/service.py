"""A TransferQueue served as its own process (``dressage tq serve``), so it outlives every Proxy and trainer.

It starts the deployment its settings name (``local``: Controller and StorageUnits as processes on this
host; ``ray``: units as Ray actors), writes the client spec that ``proxy serve --transfer-queue-spec``
and trainers join with, and serves until it is told to stop; the spec file goes with it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from dressage.errors import ConfigError
from dressage.flags import flag, load_yaml
from dressage.tq.config import DEPLOYMENTS, TransferQueueConfig
from dressage.tq.deploy.transfer_queue import TransferQueue

__all__ = ["TqServeConfig", "serve_transfer_queue"]


@dataclass(kw_only=True, slots=True)
class TqServeConfig:
    """A TransferQueue as a service of its own."""

    config: str | None = field(default=None, metadata=flag("--config", metavar="FILE"))
    """The TransferQueue's settings: the YAML ``--transfer-queue-config`` reads (``examples/transfer_queue.yaml``);
    none: a ``local`` deployment with the defaults."""
    deployment: str | None = field(default=None, metadata=flag(choices=DEPLOYMENTS))
    """Overrides the file's ``deployment``; a served TQ whose file names none is ``local`` (processes that
    outlive no one but this one)."""
    spec_out: str = field(metadata=flag(metavar="FILE"))
    """Where the client spec is written (JSON, 0600: it carries the secret); removed when the service stops."""

    def __post_init__(self) -> None:
        if self.config is not None and (not isinstance(self.config, str) or not self.config):
            raise ConfigError(f"config: expected a YAML file, got {self.config!r}")
        if not isinstance(self.spec_out, str) or not self.spec_out:
            raise ConfigError(f"spec_out: expected a file path, got {self.spec_out!r}")

    def settings(self) -> TransferQueueConfig:
        """The deployment to start (the file read now): ``--deployment``, else the file's, else ``local``."""
        raw = load_yaml(self.config, what="transfer_queue") if self.config is not None else None
        settings = TransferQueueConfig.from_dict(raw)
        if self.deployment is not None:
            return settings.replace(deployment=self.deployment)
        body = raw.get("transfer_queue") if isinstance(raw, dict) and set(raw) == {"transfer_queue"} else raw
        if not isinstance(body, dict) or "deployment" not in body:
            return settings.replace(deployment="local")
        return settings


def serve_transfer_queue(config: TqServeConfig, stop: threading.Event,
                         ready: Callable[[TransferQueue], None] | None = None) -> None:
    """Start the TransferQueue, write its spec, call ``ready(tq)``, serve until ``stop`` is set, then stop
    it and remove the spec (a process that joins after that learns at once that nothing serves it)."""
    from dressage.tq.client.spec import check_spec_path, write_client_spec

    settings = config.settings()
    check_spec_path(config.spec_out)  # a spec that cannot be written is refused before anything starts
    tq = TransferQueue.start(settings)
    try:
        write_client_spec(tq.client_spec(), config.spec_out)
        if ready is not None:
            ready(tq)
        while not stop.wait(0.5):
            pass
    finally:
        try:
            os.unlink(config.spec_out)
        except OSError:
            pass
        tq.shutdown()
