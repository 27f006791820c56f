"""The case registry and runner of ``dressage bench faults``."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from dressage.errors import ConfigError

__all__ = ["FaultsConfig", "CaseResult", "case", "run_faults", "load_cases", "CASES"]


@dataclass(kw_only=True, slots=True)
class FaultsConfig:
    """Sizes of the fault, fuzz, soak and load cases."""

    quick: bool = False
    """Smaller sizes (CI): soak iterations, fuzz inputs and load sessions are cut."""
    soak_iterations: int = 100
    """Iterations of the ``dressage run`` loop in the soak."""
    fuzz_inputs: int = 400
    """Hostile HTTP requests (and as many ZMQ frames) sent by the fuzzers."""
    load_sessions: int = 200
    """Concurrent agent sessions against one Proxy in the load case."""
    load_turns: int = 3
    load_rounds: int = 3
    """Timed rounds of the load case (each: every session through the Proxy, then the same prompts
    straight to the engine), after one untimed warm-up round of each."""
    schema_cases: int = 2000
    """Requests schemathesis generates from the Proxy's OpenAPI schema (case ``schema_fuzz``)."""
    only: tuple[str, ...] = ()
    """Run just these cases (names as listed by ``--list``)."""
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("soak_iterations", "fuzz_inputs", "load_sessions", "load_turns", "load_rounds", "schema_cases"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"faults.{key} must be a positive integer, got {v!r}")
        load_cases()
        unknown = [n for n in self.only if n not in CASES]
        if unknown:
            raise ConfigError(f"faults.only: unknown cases {unknown}; known: {', '.join(CASES)}")
        if self.quick:
            self.soak_iterations = min(self.soak_iterations, 30)
            self.fuzz_inputs = min(self.fuzz_inputs, 150)
            self.load_sessions = min(self.load_sessions, 64)
            self.schema_cases = min(self.schema_cases, 200)


@dataclass(slots=True)
class CaseResult:
    name: str
    passed: bool
    detail: dict[str, Any]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail, "seconds": round(self.seconds, 3)}


CASES: dict[str, Callable[[FaultsConfig], tuple[bool, dict[str, Any]]]] = {}


def case(name: str):
    def register(fn):
        CASES[name] = fn
        return fn
    return register


def load_cases() -> dict[str, Callable[[FaultsConfig], tuple[bool, dict[str, Any]]]]:
    """Import the case modules (importing registers their cases)."""
    from dressage_bench.faults import (cases_backpressure, cases_durability, cases_engine,  # noqa: F401
                                       cases_inputs, cases_proxy, cases_tq, cases_tq_service, fuzz, load, soak)

    return CASES


def run_faults(cfg: FaultsConfig, *, progress: bool = False) -> dict[str, Any]:
    """Run the selected cases; returns the ``bench faults`` JSON document."""
    load_cases()
    names = list(cfg.only or CASES)
    results: list[CaseResult] = []
    extra: dict[str, Any] = {}
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(names), desc="bench faults", unit="case")
    for name in names:
        t0 = time.perf_counter()
        try:
            passed, detail = CASES[name](cfg)
        except Exception as exc:  # a crashed case is a failed case, with its traceback as evidence
            passed, detail = False, {"error": f"{type(exc).__name__}: {exc}",
                                     "traceback": traceback.format_exc(limit=6)}
        results.append(CaseResult(name, bool(passed), detail, time.perf_counter() - t0))
        for section in ("soak", "fuzz", "load", "schema"):
            if section in detail and isinstance(detail[section], dict):
                extra.setdefault(section, {}).update(detail[section])
        if bar is not None:
            bar.update(1)
            bar.set_postfix(last=name, ok=passed)
    if bar is not None:
        bar.close()
    fuzz = extra.get("fuzz", {})
    return {
        "cases": [r.to_dict() for r in results],
        "passed": sum(r.passed for r in results),
        "failed": sum(not r.passed for r in results),
        "soak": extra.get("soak", {}),
        "fuzz": {"inputs": int(fuzz.get("inputs", 0)), "server_errors": int(fuzz.get("server_errors", 0)), **fuzz},
        "load": extra.get("load", {}),
        "schema": extra.get("schema", {}),
        "config": {"quick": cfg.quick, "soak_iterations": cfg.soak_iterations, "fuzz_inputs": cfg.fuzz_inputs,
                   "load_sessions": cfg.load_sessions, "load_rounds": cfg.load_rounds, "schema_cases": cfg.schema_cases},
    }
