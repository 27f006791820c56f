"""Dressage's own TransferQueue under the bench: embedded (one process) and across processes.

The systems use only the public client API (``TransferQueue.start``, ``client.put`` / ``get_many`` /
``clear``), so the figures are what a Proxy and a trainer would get.
"""

from __future__ import annotations

from typing import Any

from dressage.bench._systems import BenchSystem, SystemUnavailable, Workload, make_items
from dressage.bench._timing import RoundTiming, Stopwatch

__all__ = ["DressageEmbeddedSystem", "tq_budget_bytes"]

MiB = 1 << 20


def tq_budget_bytes(largest_round_bytes: int) -> int:
    """A StorageUnit budget that holds two rounds, so a bench never measures spilling to disk."""
    return max(256 * MiB, 2 * int(largest_round_bytes) + 64 * MiB)


def _import_tq() -> Any:
    try:
        import dressage.tq as dtq
    except ImportError as exc:
        raise SystemUnavailable(f"dressage.tq is not importable: {exc}") from exc
    for name in ("TransferQueue", "TransferQueueConfig"):
        if not hasattr(dtq, name):
            raise SystemUnavailable(f"dressage.tq has no {name} yet")
    return dtq


class DressageEmbeddedSystem(BenchSystem):
    """Client and StorageUnit in this process: the ``embedded`` deployment ``dressage run`` uses."""

    name = "dressage-embedded"

    def __init__(self, budget_bytes: int, seed: int = 0) -> None:
        self._budget = int(budget_bytes)
        self._seed = seed
        self._tq: Any = None
        self._client: Any = None
        self._items: list[Any] = []
        self._round = 0

    def start(self) -> None:
        dtq = _import_tq()
        config = dtq.TransferQueueConfig(
            deployment="embedded", unit_memory_budget=self._budget, on_full="error", retention_s=None
        )
        self._tq = dtq.TransferQueue.start(config)
        self._client = self._tq.client()

    def prepare(self, workload: Workload) -> None:
        self._items = make_items(workload, self._seed)

    def run_round(self, workload: Workload) -> RoundTiming:
        self._round += 1
        batch = f"bench-{workload.name}-{self._round}"
        client = self._client
        with Stopwatch() as put:
            refs = [client.put(workload.field, a, batch=batch) for a in self._items]
        with Stopwatch() as get:
            arrays = client.get_many(refs)
        del arrays
        client.clear(batch)
        return RoundTiming(put.seconds, get.seconds)

    def finish(self, workload: Workload) -> None:
        self._items = []

    def close(self) -> None:
        if self._tq is not None:
            self._tq.shutdown()
            self._tq = self._client = None

    def describe(self) -> dict[str, object]:
        return {"path": "client.put -> in-process StorageUnit -> client.get_many, one process"}


class DressageAcrossSystem(BenchSystem):
    """Writer, StorageUnit and reader in separate processes on two simulated nodes."""

    across_processes = True

    def __init__(self, cluster: Any, budget_bytes: int, seed: int = 0, *, shm: bool = False) -> None:
        self.name = "dressage-shm" if shm else "dressage-zmq"  # type: ignore[misc]
        self._shm = shm

    def start(self) -> None:
        raise SystemUnavailable("dressage.tq has no cross-process client yet")

    def run_round(self, workload: Workload) -> RoundTiming:
        raise SystemUnavailable("not started")
