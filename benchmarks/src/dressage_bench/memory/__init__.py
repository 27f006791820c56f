"""``dressage bench memory``: the seed's main experiment scaled to one machine.

The master node's trajectory data plane (Proxy, RolloutManager, object store, TQ Controller, local
StorageUnit) measured by PSS on a timer, without TQ and with TQ, for each R3 storage dtype.

The names below load on first use: the ``dressage`` command registers this benchmark's flags on every
start (``dressage proxy serve`` too), and the runner imports Ray.
"""

from __future__ import annotations

from dressage._lazy import lazy_exports

_EXPORTS = {"run_memory_bench": "dressage_bench.memory.bench", "MemoryBenchConfig": "dressage_bench.memory.config",
            "PRESETS": "dressage_bench.memory.config", "METRIC_COMPONENTS": "dressage_bench.memory.pipeline",
            "PathRun": "dressage_bench.memory.pipeline", "run_path": "dressage_bench.memory.pipeline",
            "build_report": "dressage_bench.memory.report", "format_table": "dressage_bench.memory.report",
            "write_json": "dressage_bench.memory.report"}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
