"""``dressage bench faults``: fault injection, fuzzing, soak and load against the real processes.

Each case starts what it needs (engine, Proxy, StorageUnit processes), injects one fault or load,
and reports ``passed`` with the figures that decide it. Nothing here asserts on wall-clock time
except the bounds a case is about (e.g. "a dead unit fails a read within its timeout").
"""

from dressage_bench.faults.runner import CASES, FaultsConfig, run_faults

__all__ = ["FaultsConfig", "run_faults", "CASES"]
