"""Soak: many iterations of the ``dressage run`` loop; memory, sockets and threads must stay flat."""

from __future__ import annotations

from typing import Any

import numpy as np

from dressage.bench.faults._stack import serve_process
from dressage.bench.faults.runner import FaultsConfig, case
from dressage.fields import get_model
from dressage.proxy.config import DataPlaneConfig
from dressage.run import RunConfig, run_pipeline

# Growth allowed after warm-up: noise of the allocator and caches, far below one rollout's payload.
_SLOPE_LIMIT = 64 * 1024      # bytes per iteration
_FD_SLACK, _THREAD_SLACK = 2, 2


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
    dp = DataPlaneConfig(model=get_model("qwen3.6-35b-a3b"), use_rollout_routing_replay=True,
                         enable_transfer_queue=True, routed_experts_dtype="uint8")
    # The engine runs in its own process: its prefix cache grows by design and is not what we soak.
    engine = serve_process(["engine", "serve", "--model", "qwen3.6-35b-a3b", "--mean-response-tokens", "32",
                            "--tool-call-rate", "0.4", "--seed", str(cfg.seed)])
    try:
        run = RunConfig(data_plane=dp, num_rollouts=cfg.soak_iterations, rollout_batch_size=4,
                        n_samples_per_prompt=2, max_turns=3, max_tokens=48, retry_rate=0.2, seed=cfg.seed,
                        engine_url=engine.url, progress=False)
        report = run_pipeline(run)
    finally:
        engine.stop()
    rows = report.rollouts
    warm = max(1, len(rows) // 5)  # first iterations fill caches and pools
    steady = rows[warm:]
    pss = [r["pss_bytes"] for r in steady]
    mem_slope = slope(floor(pss))
    raw_slope = slope(pss)
    keys_left = max(r["tq_keys_left"] for r in rows)
    fd_growth = steady[-1]["open_fds"] - steady[0]["open_fds"] if steady else 0
    thread_growth = steady[-1]["threads"] - steady[0]["threads"] if steady else 0
    held = max(r["proxy_sessions_held"] for r in rows)
    detail = {
        "soak": {"iterations": len(rows), "memory_slope_bytes_per_iter": round(mem_slope, 1),
                 "raw_memory_slope_bytes_per_iter": round(raw_slope, 1), "keys_left": keys_left,
                 "open_fds_growth": fd_growth, "threads_growth": thread_growth,
                 "pss_first_mib": round(pss[0] / 2**20, 1) if pss else None,
                 "pss_last_mib": round(pss[-1] / 2**20, 1) if pss else None,
                 "proxy_sessions_held_max": held, "agent_errors": report.agent.get("errors", 0),
                 "sessions": report.sessions, "segments": report.segments},
    }
    passed = (keys_left == 0 and mem_slope < _SLOPE_LIMIT and fd_growth <= _FD_SLACK
              and thread_growth <= _THREAD_SLACK and held == 0 and report.agent.get("errors", 0) == 0)
    return passed, detail
