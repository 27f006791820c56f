"""Soak: many iterations of ``dressage run``; memory, sockets and threads must stay flat, no key left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dressage_bench.faults._stack import serve_process
from dressage_bench.faults.runner import FaultsConfig, case

# Growth allowed after warm-up: noise of the allocator and caches, far below one rollout's payload.
_SLOPE_LIMIT = 64 * 1024      # bytes per iteration
# A slope over fewer steady iterations is mostly allocator noise (the quick form's 24 swing 40-90 KiB per
# iteration on the same code): it is reported, and judged only from this many on (the full soak's 80).
_SLOPE_MIN_ITERS = 50
_FD_SLACK, _THREAD_SLACK = 2, 2
_ARENAS = "2"


def slope(ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against their index."""
    if len(ys) < 2:
        return 0.0
    x = np.arange(len(ys), dtype=np.float64)
    return float(np.polyfit(x, np.asarray(ys, dtype=np.float64), 1)[0])


def floor(ys: list[float], window: int = 5) -> list[float]:
    """Rolling minimum: a leak raises the floor, a transient peak does not."""
    return [min(ys[max(0, i - window + 1):i + 1]) for i in range(len(ys))]


@case("soak")
def soak(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    """``dressage run`` for many iterations in its own process, its vitals recorded after each one."""
    # The engine runs in its own process too: its prefix cache grows by design and is not what we soak.
    engine = serve_process(["engine", "serve", "--model", "qwen3.6-35b-a3b", "--mean-response-tokens", "32",
                            "--tool-call-rate", "0.4", "--seed", str(cfg.seed)])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run.json"
            cmd = [sys.executable, "-m", "dressage", "run", "--num-rollouts", str(cfg.soak_iterations),
                   "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--max-turns", "3",
                   "--max-tokens", "48", "--retry-rate", "0.2", "--seed", str(cfg.seed), "--engine-url", engine.url,
                   "--use-rollout-routing-replay", "--enable-transfer-queue", "--routed-experts-dtype", "uint8",
                   "--no-progress", "--json", str(out)]
            # glibc gives each thread that allocates its own arena and never returns their fragments; two
            # arenas (a usual setting for threaded Python services) make PSS track live memory.
            env = {**os.environ, "MALLOC_ARENA_MAX": _ARENAS}
            proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  timeout=60 + 10 * cfg.soak_iterations)
            # Exit 1 is a FAIL verdict after a full run: its report still says which figure failed.
            if proc.returncode != 0 and not (proc.returncode == 1 and out.is_file()):
                return False, {"error": f"dressage run exited {proc.returncode}: {proc.stderr[-500:]}"}
            report = json.loads(out.read_text())
    finally:
        engine.stop()
    rows = report["rollouts"]
    warm = max(5, len(rows) // 5)  # first iterations fill caches, pools and the directory's tombstones
    steady = rows[warm:]
    pss = [r["pss_bytes"] for r in steady]
    mem_slope = slope(floor(pss))
    counts = [r["tq_keys_left"] for r in rows]  # None: a StorageUnit did not answer that rollout's count
    keys_left = None if None in counts else max(counts)
    fd_growth = steady[-1]["open_fds"] - steady[0]["open_fds"] if steady else 0
    thread_growth = steady[-1]["threads"] - steady[0]["threads"] if steady else 0
    held = max(r["proxy_sessions_held"] for r in rows)
    errors = report["agent"].get("errors", 0)
    judged = len(steady) >= _SLOPE_MIN_ITERS
    detail = {
        "soak": {"iterations": len(rows), "memory_slope_bytes_per_iter": round(mem_slope, 1),
                 "memory_slope_judged": judged,
                 "raw_memory_slope_bytes_per_iter": round(slope(pss), 1), "keys_left": keys_left,
                 "open_fds_growth": fd_growth, "threads_growth": thread_growth,
                 "pss_first_mib": round(pss[0] / 2**20, 1) if pss else None,
                 "pss_last_mib": round(pss[-1] / 2**20, 1) if pss else None,
                 "proxy_sessions_held_max": held, "agent_errors": errors,
                 "sessions": report["sessions"], "segments": report["segments"], "malloc_arena_max": int(_ARENAS)},
        "pss_mib_per_iteration": [round(r["pss_bytes"] / 2**20, 2) for r in rows],
    }
    passed = (keys_left == 0 and (mem_slope < _SLOPE_LIMIT or not judged) and fd_growth <= _FD_SLACK
              and thread_growth <= _THREAD_SLACK and held == 0 and errors == 0)
    return passed, detail
