"""Rollout after rollout, a released batch leaves nothing behind: the Controller's directory, its
deletion queue and the StorageUnits' maps return to empty, so no per-rollout cost can grow with the
number of rollouts already run."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from dressage.errors import TransferQueueError
from dressage.tq import TransferQueue
from dressage.tq.directory import controller as controller_mod
from dressage.tq.client.batching import PutBatcher
from dressage.train import release_batch


def _state(tq: TransferQueue) -> dict:
    ctl = tq.controller
    units = tq.storage_units()
    return {
        "entries": len(ctl._entries), "to_delete": sum(len(k) for k in ctl._to_delete.values()),
        "used": dict(ctl._used), "count": dict(ctl._count),
        "blobs": {u: len(s._blobs) for u, s in units.items()}, "sums": {u: len(s._sums) for u, s in units.items()},
        "unit_bytes": {u: s.usage()["memory_bytes"] for u, s in units.items()},
    }


def _rollout(batcher: PutBatcher, rollout: int, steps: int) -> list[str]:
    """``steps`` steps, each two fields, submitted from concurrent callers as the Proxy does."""
    def step(i: int) -> list:
        rng = np.random.default_rng(rollout * 1000 + i)
        items = [("logprobs", rng.random(64 + i, dtype=np.float32)),
                 ("routed_experts", rng.integers(0, 255, (64 + i, 4, 2), dtype=np.uint8))]
        keys = [f"r{rollout}-s{i}-lp", f"r{rollout}-s{i}-r3"]
        return batcher.submit(items, keys=keys, batch=f"rollout-{rollout}").result(10)

    with ThreadPoolExecutor(8) as pool:
        refs = [r for got in pool.map(step, range(steps)) for r in got]
    return [r.key for r in refs]


def test_every_release_returns_the_directory_and_the_units_to_empty(monkeypatch):
    monkeypatch.setattr(controller_mod, "_TOMBSTONES", 50)  # the cleared-key memory is bounded
    with TransferQueue.start({"deployment": "embedded", "num_storage_units": 2, "unit_memory_budget": "64MiB",
                              "retention_s": None}) as tq:
        client = tq.client()
        batcher = PutBatcher(client)
        empty = _state(tq)
        try:
            for rollout in range(5):
                keys = _rollout(batcher, rollout, steps=40)
                during = _state(tq)
                assert during["entries"] == len(keys) == 80 and sum(during["blobs"].values()) == 80
                with pytest.raises(TransferQueueError, match="not one string"):
                    release_batch(client, keys[0])  # one key is not a batch of its characters
                assert release_batch(client, keys) == 80
                tq.run_janitor()  # the queued duplicate deletions are drained, not kept
                assert _state(tq) == empty, rollout
                assert len(tq.controller._tombstones) <= 50
                assert tq.controller.state(keys[-1]).value == "cleared"
        finally:
            batcher.close()
        assert batcher.pending() == 0 and batcher.steps == 5 * 40
    assert empty["entries"] == 0 and all(v == 0 for v in empty["used"].values())
