"""``transferqueue`` deployment: the payload in a public TransferQueue (PyPI ``transferqueue``) on Ray,
in upstream Dressage's step layout; the directory (batches, consumption, retention) in this process.

The public TransferQueue is joined when one runs in the cluster (its named controller actor) and started
otherwise; only one it started is closed at shutdown. Clients look as they do in every deployment: one
:class:`~dressage.tq.storage.kv.KVStorageUnit` behind our Controller, run by an embedded deployment over
that one unit (served over ZMQ to other processes on demand, as it serves its own units).
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from dressage.errors import StorageUnitUnavailable
from dressage.tq.client.client import TransferQueueClient
from dressage.tq.config import TransferQueueConfig
from dressage.tq.deploy.embedded import EmbeddedDeployment
from dressage.tq.storage import StorageUnit
from dressage.tq.storage.kv import KVStorageUnit

__all__ = ["KVDeployment", "UNIT_ID"]

log = logging.getLogger(__name__)

UNIT_ID = "transferqueue"
# The public TransferQueue's controller: one named actor per cluster.
_CONTROLLER_NAME, _NAMESPACE = "TransferQueueController", "transfer_queue"


class KVDeployment:
    """One KVStorageUnit over the cluster's public TransferQueue; our Controller, Janitor and servers over
    it are an :class:`EmbeddedDeployment`'s (``local``)."""

    def __init__(self, config: TransferQueueConfig) -> None:
        try:
            import ray
            import transfer_queue
        except ImportError as exc:
            raise StorageUnitUnavailable(
                "transfer_queue.deployment: transferqueue needs the public TransferQueue and Ray: "
                "pip install 'dressage[transferqueue]'") from exc
        self.config = config
        self._api = transfer_queue
        self._started_ray = self._started_tq = False
        self.local: EmbeddedDeployment | None = None
        self._sweeper: threading.Thread | None = None
        self._stop = threading.Event()
        try:
            if not ray.is_initialized():
                ray.init(address=config.ray_address, include_dashboard=False)
                self._started_ray = True
            self._started_tq = not _running(ray)
            _init_within(transfer_queue, _tq_settings(config) if self._started_tq else None,
                         config.startup_timeout_s)
            self.store_id = config.store_id or uuid.uuid4().hex[:12]
            self.unit = KVStorageUnit(UNIT_ID, store_id=self.store_id, api=transfer_queue,
                                      memory_budget=config.budget_bytes, retention_s=config.retention_s)
            # Put timing is the public TransferQueue's: a strict budget here would refuse, never spill. Every
            # write goes the plain placed way: the unit is no in-process buffer to lease or write into.
            self.local = EmbeddedDeployment(config.replace(on_full="error"), units={UNIT_ID: self.unit},
                                            fast_writes=False)
            self.controller = self.local.controller
            if config.retention_s is not None:
                self._sweeper = threading.Thread(target=self._sweep_loop, name="tq-kv-retention", daemon=True)
                self._sweeper.start()
        except BaseException:
            self.shutdown()
            raise

    # docstrings inherited from tq/deploy/base.py:Deployment
    @property
    def secret_file(self) -> Any:
        return None if self.local is None else self.local.secret_file

    def client(self, node_id: str | None) -> TransferQueueClient:
        return self.local.client(node_id)

    def client_spec(self) -> dict[str, Any]:
        return self.local.client_spec()

    def unit_handles(self) -> dict[str, StorageUnit]:
        return self.local.unit_handles()

    def processes(self) -> dict[str, int]:
        return self.local.processes()

    def run_janitor(self) -> int:
        """Our Controller's sweep and queued deletions, then the rows of this store whose ``expires_at``
        tag passed (rows a Proxy that died left behind included)."""
        return self.local.run_janitor() + self.unit.sweep_expired()

    def _sweep_loop(self) -> None:
        # Rows are swept by their ``expires_at`` tag, as upstream's retention loop does (our Controller's
        # retention covers only the keys written here). Each sweep lists the whole partition: at most
        # once a minute, and often enough that a row outlives its expiry by a tenth of retention_s at most.
        interval = min(max(float(self.config.retention_s or 0) / 10.0, 1.0), 60.0)
        while not self._stop.wait(interval):
            try:
                self.unit.sweep_expired()
            except Exception as exc:  # noqa: BLE001 - the queue may be briefly out of reach; next round
                log.warning("transferqueue retention sweep failed: %s", exc)

    def kv_rows(self) -> dict[str, dict[str, Any]]:
        """``{kv_key: tag}`` of this store's partition, as the public TransferQueue lists it."""
        return self.unit.kv_rows()

    def shutdown(self) -> None:
        self._stop.set()
        if self._sweeper is not None:
            self._sweeper.join()
            self._sweeper = None
        if self.local is not None:
            self.local.shutdown()
            self.local = None
        if self._started_tq:
            self._started_tq = False
            try:
                self._api.close()
            except Exception as exc:  # noqa: BLE001 - shutting down: the actors may be gone already
                log.warning("closing the public TransferQueue failed: %s", exc)
        if self._started_ray:
            import ray

            self._started_ray = False
            ray.shutdown()


def _running(ray: Any) -> bool:
    """Whether a public TransferQueue already runs in the cluster (its named controller exists)."""
    try:
        ray.get_actor(_CONTROLLER_NAME, namespace=_NAMESPACE)
    except ValueError:
        return False
    return True


def _init_within(api: Any, settings: Any, timeout_s: float) -> None:
    """``api.init(settings)``, or StorageUnitUnavailable after ``timeout_s``: its actors wait for Ray
    resources without a deadline of their own (its controller and storage units on a cluster too small)."""
    failure: list[BaseException] = []

    def init() -> None:
        try:
            api.init(settings)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=init, name="tq-kv-init", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise StorageUnitUnavailable(
            f"the public TransferQueue did not start within {timeout_s:g} s (startup_timeout_s); its controller "
            "and storage units are Ray actors: does the cluster have the CPUs for them?")
    if failure:
        raise StorageUnitUnavailable(f"the public TransferQueue did not start: {failure[0]}") from failure[0]


def _tq_settings(config: TransferQueueConfig) -> Any:
    """The public TransferQueue's settings for a store this deployment starts itself."""
    from omegaconf import OmegaConf

    units = config.num_storage_units or 1
    return OmegaConf.create({"backend": {"storage_backend": "SimpleStorage",
                                         "SimpleStorage": {"num_data_storage_units": units}}})
