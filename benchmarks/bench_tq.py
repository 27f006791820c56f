"""TransferQueue bandwidth against memcpy, the Ray object store and transferqueue (same run, same payloads).

A thin wrapper of ``dressage bench tq``; every flag is the same, e.g.::

    python benchmarks/bench_tq.py --quick --json out/bench_tq.json
"""

from __future__ import annotations

import sys

from dressage.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "tq", *sys.argv[1:]]))
