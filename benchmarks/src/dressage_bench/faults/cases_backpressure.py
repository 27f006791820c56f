"""Backpressure cases of ``dressage bench faults``: rollout faster than training fills the budgets.

With ``on_full: wait`` producers wait for space, with ``on_full: spill`` units spill to disk; either way
a unit's held memory stays under its budget and nothing is dropped.
"""

from __future__ import annotations

import queue
import tempfile
import threading
import time
from typing import Any

import numpy as np

from dressage_bench.faults.cases_tq import _local
from dressage_bench.faults.runner import FaultsConfig, case
from dressage.tq import TransferQueue


def _held_sampler(tq: TransferQueue, stop: threading.Event, out: dict[str, int]) -> None:
    """Samples the unit's held bytes (its own count) and its process RSS while the case runs."""
    import psutil

    pid = tq.processes()["unit0"]
    proc = psutil.Process(pid)
    base = proc.memory_info().rss
    out.update(samples=0, max_held=0, max_rss_growth=0)
    while not stop.wait(0.02):
        try:
            s = tq.stats()["unit0"]
            out["max_held"] = max(out["max_held"], int(s.get("held_bytes", s["memory_bytes"])))
            out["max_rss_growth"] = max(out["max_rss_growth"], proc.memory_info().rss - base)
            out["samples"] += 1
        except Exception:  # a sample that misses is just a sample fewer
            pass


@case("backpressure_wait")
def backpressure_wait(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    budget = 4 << 20
    blob_bytes, n = 256 << 10, (64 if cfg.quick else 256)   # 4x (quick) or 16x the budget in flight
    tq = TransferQueue.start(_local(1, unit_memory_budget=budget, on_full="wait", full_wait_s=30,
                                    shared_memory=False))
    stop, sampled = threading.Event(), {}
    sampler = threading.Thread(target=_held_sampler, args=(tq, stop, sampled), daemon=True)
    try:
        producer, consumer = tq.client(), tq.client()
        handoff: queue.Queue = queue.Queue()
        bad: list[int] = []

        def consume() -> None:
            for _ in range(n):
                i, ref = handoff.get(timeout=60)
                time.sleep(0.004)  # the trainer is slower than rollout
                a = consumer.get(ref)
                if a.nbytes != blob_bytes or int(a[0]) != i % 251 or int(a[-1]) != i % 251:
                    bad.append(i)
                consumer.delete([ref])

        sampler.start()
        reader = threading.Thread(target=consume, daemon=True)
        t0 = time.monotonic()
        reader.start()
        for i in range(n):
            handoff.put((i, producer.put("routed_experts", np.full(blob_bytes, i % 251, dtype=np.uint8))))
        reader.join(timeout=120)
        seconds = time.monotonic() - t0
        stop.set()
        sampler.join(timeout=5)
        stats = tq.stats()["unit0"]
        detail = {
            "budget_bytes": budget, "bytes_produced": n * blob_bytes, "puts": n, "read_back_ok": n - len(bad),
            "dropped": len(bad), "producer_full_waits": producer.counters.full_waits,
            "unit_peak_held_bytes": stats["peak_held_bytes"], "sampled_max_held_bytes": sampled.get("max_held"),
            "peak_over_budget": round(stats["peak_held_bytes"] / budget, 3),
            "unit_rss_growth_bytes": sampled.get("max_rss_growth"), "samples": sampled.get("samples"),
            "keys_left": stats["keys"], "seconds": round(seconds, 3),
            "throughput_mb_s": round(n * blob_bytes / seconds / 1e6, 1),
        }
    finally:
        stop.set()
        tq.shutdown()
    passed = (not bad and not reader.is_alive() and detail["unit_peak_held_bytes"] <= budget
              and detail["producer_full_waits"] > 0 and detail["keys_left"] == 0)
    return passed, detail


@case("backpressure_spill")
def backpressure_spill(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    budget = 4 << 20
    blob_bytes, n = 256 << 10, (64 if cfg.quick else 256)
    with tempfile.TemporaryDirectory(prefix="dressage-faults-") as spill:
        tq = TransferQueue.start(_local(1, unit_memory_budget=budget, on_full="spill", spill_dir=spill,
                                        shared_memory=False))
        try:
            client = tq.client()
            refs = [client.put("routed_experts", np.full(blob_bytes, i % 251, dtype=np.uint8), batch="b")
                    for i in range(n)]  # nobody consumes: everything past the budget must spill
            stats = tq.stats()["unit0"]
            got = client.get_many(refs)
            ok = sum(int(a[0]) == i % 251 and int(a[-1]) == i % 251 for i, a in enumerate(got))
            del got
            cleared = client.clear("b")
            after = tq.stats()["unit0"]
            detail = {
                "budget_bytes": budget, "bytes_produced": n * blob_bytes, "memory_bytes": stats["memory_bytes"],
                "unit_peak_held_bytes": stats["peak_held_bytes"], "spilled_bytes": stats["spilled_bytes"],
                "peak_over_budget": round(stats["peak_held_bytes"] / budget, 3), "read_back_ok": ok,
                "dropped": n - ok, "keys_cleared": cleared, "spilled_bytes_after_clear": after["spilled_bytes"],
                "keys_left": after["keys"],
            }
        finally:
            tq.shutdown()
    passed = (ok == n and stats["peak_held_bytes"] <= budget and stats["spilled_bytes"] > 0
              and stats["memory_bytes"] + stats["spilled_bytes"] == n * blob_bytes and after["keys"] == 0)
    return passed, detail
