"""Peak memory of the transformers backend's tiny MoE scoring one long prompt, as a call to it does.

Each size runs in a child process (``build_moe_model`` + one :meth:`MoEModel.score` over ``--tokens``
prompt tokens and a short reply); this process samples the child's resident set with psutil every
20 ms and reports its peak, the peak the kernel itself recorded (``ru_maxrss``), and the forward
pass's wall time. Run it with the tree to measure on ``PYTHONPATH`` (``nice`` on a shared machine)::

    python benchmarks/moe_long_prompt.py --tokens 4096 16384 32768
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CHILD = r"""
import json, resource, sys, time
import numpy as np
from dressage.engine.moe import build_moe_model
n, reply = int(sys.argv[1]), int(sys.argv[2])
model = build_moe_model("tiny-qwen3-moe", vocab_size=151936, seed=1)
ids = np.random.default_rng(0).integers(0, 150000, n + reply)
started = time.perf_counter()
scores = model.score(ids, n)
print(json.dumps({"seconds": time.perf_counter() - started, "rows": int(scores.routed_experts.shape[0]),
                  "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(tokens: int, reply: int) -> dict[str, float]:
    import psutil

    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tokens), str(reply)], stdout=subprocess.PIPE, text=True)
    proc, peak = psutil.Process(child.pid), 0
    while child.poll() is None:
        try:
            peak = max(peak, proc.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    out, _ = child.communicate()
    if child.returncode != 0:
        raise SystemExit(f"the {tokens}-token run failed with exit status {child.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    if result["rows"] != tokens + reply - 1:
        raise SystemExit(f"{tokens} tokens: {result['rows']} routed rows, expected {tokens + reply - 1}")
    return {"tokens": tokens, "peak_rss_mib": peak / 2**20, **result}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384, 32768])
    parser.add_argument("--reply", type=int, default=32, help="reply tokens scored after the prompt")
    args = parser.parse_args(argv)
    rows = [measure(n, args.reply) for n in args.tokens]
    base = rows[0]["peak_rss_mib"]
    print(f"{'prompt tokens':>14} {'peak RSS MiB':>13} {'ru_maxrss MiB':>14} {'x smallest':>11} {'forward s':>10}")
    for r in rows:
        print(f"{r['tokens']:>14,} {r['peak_rss_mib']:>13.0f} {r['maxrss_mib']:>14.0f} "
              f"{r['peak_rss_mib'] / base:>11.2f} {r['seconds']:>10.1f}")


if __name__ == "__main__":
    main()
