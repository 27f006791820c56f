"""Master-node trajectory data-plane memory (PSS per component) without and with TQ, per R3 dtype.

A thin wrapper of ``dressage bench memory``; every flag is the same, e.g.::

    python benchmarks/bench_memory.py --preset small --json out/mem_small.json --plot-dir out/mem_small
"""

from __future__ import annotations

import sys

from dressage.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "memory", *sys.argv[1:]]))
