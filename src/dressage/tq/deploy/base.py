"""The one protocol every TransferQueue deployment implements; ``TransferQueue`` works only through it.

A deployment owns the Controller and the StorageUnits it brought up (in this process, as local
processes, or as Ray actors) and hands out clients of them; callers never see which one runs.
"""

from __future__ import annotations

from typing import Any, Protocol

from dressage.tq.client.client import TransferQueueClient
from dressage.tq.storage import StorageUnit

__all__ = ["Deployment"]


class Deployment(Protocol):
    """What ``TransferQueue`` asks of a running deployment.

    ``controller`` is the directory handle: the in-process Controller or its ZMQ twin.
    ``secret_file`` is the 0600 file holding a secret the deployment generated (None when the secret was
    configured, when authentication is off, or before an embedded deployment is served over ZMQ).
    """

    controller: Any

    @property
    def secret_file(self) -> Any: ...

    def client(self, node_id: str | None) -> TransferQueueClient:
        """A client in this process; ``node_id`` makes its writes prefer StorageUnits on that node."""
        ...

    def client_spec(self) -> dict[str, Any]:
        """The plain dict a client in another process joins with (``TransferQueueClient.connect``)."""
        ...

    def unit_handles(self) -> dict[str, StorageUnit]:
        """``{unit_id: StorageUnit}``: the backends themselves when in this process, else their ZMQ handles."""
        ...

    def processes(self) -> dict[str, int]:
        """``{component: pid}`` of the processes that hold TransferQueue state (for memory measurement)."""
        ...

    def run_janitor(self) -> int:
        """One retention sweep and queued-deletion pass now; the number of keys removed from units."""
        ...

    def shutdown(self) -> None:
        """Stop every server, process and actor the deployment started; safe after a failed start."""
        ...
