"""Benchmarks of the Dressage data plane, each with its baselines measured in the same run.

``dressage bench tq`` (:mod:`dressage_bench.tq`) measures TransferQueue put/get bandwidth against numpy
memcpy, the Ray object store and the public ``transferqueue`` package.
"""

from __future__ import annotations

from dressage_bench.tq import SYSTEMS, TqBenchConfig, format_table, run_tq_bench, write_json

__all__ = ["SYSTEMS", "TqBenchConfig", "run_tq_bench", "format_table", "write_json"]
