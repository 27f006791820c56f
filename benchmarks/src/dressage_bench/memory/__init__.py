"""``dressage bench memory``: the seed's main experiment scaled to one machine.

The master node's trajectory data plane (Proxy, RolloutManager, object store, TQ Controller, local
StorageUnit) measured by PSS on a timer, without TQ and with TQ, for each R3 storage dtype.
"""

from dressage_bench.memory.bench import run_memory_bench
from dressage_bench.memory.config import PRESETS, MemoryBenchConfig
from dressage_bench.memory.pipeline import METRIC_COMPONENTS, PathRun, run_path
from dressage_bench.memory.report import build_report, format_table, write_json

__all__ = ["MemoryBenchConfig", "PRESETS", "PathRun", "run_path", "METRIC_COMPONENTS", "run_memory_bench",
           "build_report", "format_table", "write_json"]
