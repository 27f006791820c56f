"""``dressage bench tq``: put/get bandwidth of TransferQueue against memcpy, Ray and ``transferqueue``.

One run measures every system on the same payloads, alternating systems round by round, and reports
medians, the ratio of each system to each baseline, and whether the targets are met:
embedded put+get >= 0.7x memcpy; across processes >= 2x the Ray object store and >= 2x ``transferqueue``
for payloads >= 1 MiB. A system that cannot run here is listed with ``"error"`` instead of figures.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from dressage.bench._systems import BenchSystem, MemcpySystem, Part, SystemUnavailable, Workload
from dressage.bench._timing import Samples, gbps, interleaved
from dressage.errors import ConfigError

__all__ = [
    "SYSTEMS",
    "BASELINES",
    "TqBenchConfig",
    "build_workloads",
    "run_tq_bench",
    "format_table",
    "write_json",
    "parse_sizes",
]

MiB = 1 << 20

# Every system the bench knows, in table order. "dressage-shm" appears only where dressage.tq
# offers a same-host shared-memory path; otherwise it is listed with an error saying so.
SYSTEMS = (
    "memcpy",
    "dressage-embedded",
    "dressage-zmq",
    "dressage-shm",
    "ray-object-store",
    "transferqueue",
)
BASELINES = ("memcpy", "ray-object-store", "transferqueue")
_SHORT = {"memcpy": "memcpy", "ray-object-store": "ray", "transferqueue": "transferqueue"}

# A 4K-token step of a 40-layer, top-8 MoE (Qwen3.6-35B-A3B): R3 at uint8 is 4096*40*8 B = 1.25 MiB;
# its logprobs are 4096 float32 = 16 KiB.
STEP_TOKENS, STEP_LAYERS, STEP_TOPK = 4096, 40, 8
# Large payloads are R3-shaped rows of 64 layers x top-8 uint8 (512 B a row) so every MiB size is whole rows.
LARGE_ROW = (64, 8)


@dataclass(kw_only=True, slots=True)
class TqBenchConfig:
    """What one ``dressage bench tq`` run measures."""

    sizes_mib: tuple[float, ...] = (1, 4, 16, 64, 256)
    """Large single payloads, in MiB (1-256 by default)."""
    rounds: int = 5
    """Timed rounds per system and workload; medians are reported."""
    warmup: int = 1
    """Untimed rounds per system and workload first (first-touch page faults, connection setup)."""
    small_r3_count: int = 64
    """Separate puts of one step's R3 (1.25 MiB each), read back in one batch."""
    small_logprobs_count: int = 256
    """Separate puts of one step's logprobs (16 KiB each), read back in one batch."""
    small_step_count: int = 64
    """Steps written whole (R3 + logprobs in one call: ``put_many`` / one object / one ``kv_put``)."""
    systems: tuple[str, ...] = SYSTEMS
    """Systems to run, a subset of :data:`SYSTEMS`."""
    tq_options: dict[str, Any] = field(default_factory=dict)
    """TransferQueueConfig settings for every dressage system (``checksums: false``, ...), to measure
    what a setting costs; ``deployment`` is the system's own, and dressage-zmq/shm set ``shared_memory``."""
    seed: int = 0
    progress: bool | None = None
    """Show a progress bar; ``None``: only when stderr is a terminal."""
    quick: bool = False
    """Recorded in the JSON; use :meth:`quick_preset` for the small preset itself."""

    def __post_init__(self) -> None:
        if not (self.sizes_mib or self.small_r3_count or self.small_logprobs_count or self.small_step_count):
            raise ConfigError("bench.sizes: nothing to measure (no sizes and no small puts)")
        for size in self.sizes_mib:
            if not isinstance(size, (int, float)) or not 0 < size <= 4096:
                raise ConfigError(f"bench.sizes: expected MiB in (0, 4096], got {size!r}")
            if int(size * MiB) % (LARGE_ROW[0] * LARGE_ROW[1]):
                raise ConfigError(f"bench.sizes: {size} MiB is not a whole number of 512-byte rows")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ConfigError(f"bench.rounds: expected an integer >= 1, got {self.rounds!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ConfigError(f"bench.warmup: expected an integer >= 0, got {self.warmup!r}")
        for name in ("small_r3_count", "small_logprobs_count", "small_step_count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"bench.{name}: expected an integer >= 0, got {value!r}")
        unknown = [s for s in self.systems if s not in SYSTEMS]
        if unknown:
            raise ConfigError(f"bench.systems: unknown {', '.join(unknown)} (known: {', '.join(SYSTEMS)})")
        if not self.systems:
            raise ConfigError("bench.systems: at least one system is needed")
        for key in self.tq_options:
            if key in ("deployment", "shared_memory"):
                raise ConfigError(f"bench.tq_options: {key} is chosen by each dressage system, not settable")
        try:
            from dressage.tq import TransferQueueConfig

            known = {f.name for f in dataclasses.fields(TransferQueueConfig)}
        except ImportError:  # no dressage.tq: its systems report that; nothing to check against
            known = set(self.tq_options)
        unknown_keys = sorted(set(self.tq_options) - known)
        if unknown_keys:
            raise ConfigError(f"bench.tq_options: unknown TransferQueue setting(s) {', '.join(unknown_keys)}")

    @classmethod
    def quick_preset(cls, **overrides: Any) -> "TqBenchConfig":
        """Small sizes and few rounds: the whole run, cluster start included, stays under a minute."""
        values: dict[str, Any] = dict(
            sizes_mib=(1, 16), rounds=3, warmup=1, small_r3_count=16, small_logprobs_count=64,
            small_step_count=16, quick=True
        )
        values.update(overrides)
        return cls(**values)


def build_workloads(config: TqBenchConfig) -> list[Workload]:
    workloads = []
    for size in config.sizes_mib:
        rows = int(size * MiB) // (LARGE_ROW[0] * LARGE_ROW[1])
        workloads.append(Workload(f"{size:g}MiB", "large", (Part("routed_experts", "uint8", (rows, *LARGE_ROW)),)))
    r3 = Part("routed_experts", "uint8", (STEP_TOKENS, STEP_LAYERS, STEP_TOPK))
    logprobs = Part("logprobs", "float32", (STEP_TOKENS,))
    if config.small_r3_count:
        workloads.append(Workload("step-r3", "small", (r3,), config.small_r3_count))
    if config.small_logprobs_count:
        workloads.append(Workload("step-logprobs", "small", (logprobs,), config.small_logprobs_count))
    if config.small_step_count:
        # What the Proxy's commit region writes per step: both fields in one call.
        workloads.append(Workload("step-r3+logprobs", "small", (r3, logprobs), config.small_step_count))
    return workloads


# --- building the systems --------------------------------------------------------------------


def _cluster(workloads: Sequence[Workload]) -> Any:
    """The simulated two-node Ray cluster the cross-process systems share; started on first use."""
    from dressage.bench._ray import BenchCluster

    largest = max(w.total_bytes for w in workloads)
    # Ray spills when a store holds less than 2-3x the largest object; give each node 3x a round.
    return BenchCluster(object_store_bytes=max(512 * MiB, 3 * largest + 128 * MiB))


def _factories(config: TqBenchConfig, workloads: Sequence[Workload],
               cluster: Any) -> dict[str, Callable[[], BenchSystem]]:
    from dressage.bench import _dressage, _ray

    budget = _dressage.tq_budget_bytes(max(w.total_bytes for w in workloads))
    options = dict(config.tq_options)
    factories: dict[str, Callable[[], BenchSystem]] = {
        "memcpy": lambda: MemcpySystem(config.seed),
        "dressage-embedded": lambda: _dressage.DressageEmbeddedSystem(budget, config.seed, options=options),
        "dressage-zmq": lambda: _dressage.DressageAcrossSystem(cluster, budget, config.seed, shm=False,
                                                               options=options),
        "dressage-shm": lambda: _dressage.DressageAcrossSystem(cluster, budget, config.seed, shm=True,
                                                               options=options),
        "ray-object-store": lambda: _ray.RayObjectStoreSystem(cluster, config.seed),
        "transferqueue": lambda: _ray.TransferQueueSystem(cluster, config.seed),
    }
    return factories


@dataclass(slots=True)
class _Run:
    system: BenchSystem | None
    name: str
    error: str | None = None
    samples: dict[str, Samples] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def _describe_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:400] if not isinstance(exc, SystemUnavailable) else first[:400]


def _progress(total: int, enabled: bool | None) -> Any:
    show = sys.stderr.isatty() if enabled is None else enabled
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a dependency, but a bench must not die for a progress bar
        show = False
    if not show:
        return _NoBar()
    return tqdm(total=total, file=sys.stderr, unit="round", leave=False, dynamic_ncols=True)


class _NoBar:
    total = 0

    def refresh(self) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def set_description_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def run_tq_bench(config: TqBenchConfig | None = None) -> dict[str, Any]:
    """Run every configured system on every workload; return the JSON-ready report."""
    config = config or TqBenchConfig()
    workloads = build_workloads(config)
    cluster = _cluster(workloads)
    factories = _factories(config, workloads, cluster)
    env_start = _environment()
    shm_before = _dev_shm()
    runs: list[_Run] = []
    # Starting Ray and transferqueue takes tens of seconds: the bar counts starts as steps too.
    bar = _progress(len(config.systems), config.progress)
    try:
        for name in config.systems:
            bar.set_description_str(f"starting {name}")
            runs.append(_start(name, factories[name]))
            bar.update()
        live = [r for r in runs if r.system is not None]
        bar.total = len(config.systems) + len(workloads) * len(live) * (config.rounds + config.warmup)
        bar.refresh()
        for workload in workloads:
            _measure(workload, live, config, bar)
    finally:
        bar.close()
        for run in runs:
            if run.system is not None:
                try:
                    run.system.close()
                except Exception as exc:  # report, but keep closing the others
                    run.errors.setdefault("close", _describe_error(exc))
        cluster.close()
    # Anything a system left in /dev/shm is a leak worth reporting (the bench itself creates nothing).
    env_start["dev_shm_left_behind"] = sorted(_dev_shm() - shm_before)
    return _report(config, workloads, runs, env_start)


def _dev_shm() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _start(name: str, factory: Callable[[], BenchSystem]) -> _Run:
    try:
        system = factory()
        system.start()
    except Exception as exc:  # any failure to start means "cannot run here", with the reason
        try:
            if "system" in locals():
                system.close()
        except Exception:
            pass
        return _Run(None, name, error=_describe_error(exc))
    return _Run(system, name)


def _measure(workload: Workload, live: list[_Run], config: TqBenchConfig, bar: Any) -> None:
    ready: list[_Run] = []
    for run in live:
        if run.error is not None:
            run.errors[workload.name] = f"skipped after an earlier failure: {run.error}"
            bar.update(config.rounds + config.warmup)
            continue
        system = run.system
        if system is None:
            continue
        bar.set_description_str(f"{workload.name} {run.name} warm-up")
        try:
            system.prepare(workload)
            for _ in range(config.warmup):
                system.run_round(workload)
                bar.update()
        except Exception as exc:
            _fail(run, workload, exc)
            bar.update(config.rounds)
            continue
        run.samples[workload.name] = Samples()
        ready.append(run)
    failed: set[str] = set()
    for _, run in interleaved(ready, config.rounds):
        if run.name in failed:
            continue
        bar.set_description_str(f"{workload.name} {run.name}")
        try:
            run.samples[workload.name].add(_system(run).run_round(workload))
        except Exception as exc:
            failed.add(run.name)
            _fail(run, workload, exc)
        bar.update()
    for run in ready:
        try:
            _system(run).finish(workload)
        except Exception as exc:
            _fail(run, workload, exc)


def _system(run: _Run) -> BenchSystem:
    if run.system is None:  # only started runs reach the timed loop
        raise SystemUnavailable(run.error or f"{run.name} did not start")
    return run.system


def _fail(run: _Run, workload: Workload, exc: BaseException) -> None:
    # A system that failed once is not retried: a hung actor would cost a timeout per round.
    reason = _describe_error(exc)
    run.errors[workload.name] = reason
    run.samples.pop(workload.name, None)
    run.error = f"{workload.name}: {reason}"


# --- the report -------------------------------------------------------------------------------


def _report(config: TqBenchConfig, workloads: list[Workload], runs: list[_Run],
            env_start: dict[str, Any]) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for workload in workloads:
        for run in runs:
            entry: dict[str, Any] = {
                "system": run.name,
                "workload": workload.name,
                "kind": workload.kind,
                "fields": [p.field for p in workload.parts],
                "dtypes": [p.dtype for p in workload.parts],
                "shapes": [list(p.shape) for p in workload.parts],
                "payload_bytes": workload.item_bytes,
                "count": workload.count,
                "total_bytes": workload.total_bytes,
            }
            samples = run.samples.get(workload.name)
            if run.system is None:
                entry["error"] = run.error
            elif samples is None or not len(samples):
                entry["error"] = run.errors.get(workload.name, run.error or "not measured")
            else:
                n = workload.total_bytes
                entry.update(
                    put_gbps=gbps(n, samples.put_s),
                    get_gbps=gbps(n, samples.get_s),
                    roundtrip_gbps=gbps(n, samples.roundtrip_s),
                    put_s=samples.put_s,
                    get_s=samples.get_s,
                    roundtrip_s=samples.roundtrip_s,
                    roundtrip_s_range=list(samples.roundtrip_range_s),
                    puts_per_s=workload.count / samples.put_s if samples.put_s > 0 else None,
                    rounds=len(samples),
                    across_processes=type(run.system).across_processes,
                )
            results.append(entry)
            by_key[(run.name, workload.name)] = entry
    ratios = _ratios(workloads, runs, by_key)
    return {
        "results": results,
        "ratios": ratios,
        "targets": _targets(workloads, by_key),
        "systems": {run.name: _system_info(run) for run in runs},
        "config": {**asdict(config), "sizes_mib": list(config.sizes_mib), "systems": list(config.systems),
                   "tq_options": dict(config.tq_options)},
        "units": {
            "gbps": "decimal GB/s = payload bytes / 1e9 / median seconds",
            "roundtrip_gbps": "payload bytes / median(put + get seconds) of the same round",
            "ratios": "roundtrip_gbps of the system / roundtrip_gbps of the baseline, same workload",
        },
        "environment": {**env_start, "loadavg_end": _loadavg()},
    }


def _system_info(run: _Run) -> dict[str, Any]:
    if run.system is None:
        return {"error": run.error}
    info = dict(run.system.describe())
    if "close" in run.errors:
        info["close_error"] = run.errors["close"]
    return info


def _ratios(workloads: list[Workload], runs: list[_Run],
            by_key: dict[tuple[str, str], dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for workload in workloads:
        per_system: dict[str, dict[str, float]] = {}
        for run in runs:
            entry = by_key[(run.name, workload.name)]
            if "roundtrip_gbps" not in entry:
                continue
            ratios: dict[str, float] = {}
            for baseline in BASELINES:
                base = by_key.get((baseline, workload.name), {})
                if baseline != run.name and base.get("roundtrip_gbps"):
                    value = entry["roundtrip_gbps"] / base["roundtrip_gbps"]
                    ratios[baseline] = value
                    entry[f"ratio_{_SHORT[baseline]}"] = value
            per_system[run.name] = ratios
        out[workload.name] = per_system
    return out


# (target name, system, baseline, required ratio, which workloads count)
_TARGETS: tuple[tuple[str, str, str, float], ...] = (
    ("embedded put+get >= 0.7x memcpy", "dressage-embedded", "memcpy", 0.7),
    ("across processes put+get >= 2x ray-object-store", "dressage-zmq", "ray-object-store", 2.0),
    ("across processes put+get >= 2x transferqueue", "dressage-zmq", "transferqueue", 2.0),
    ("same-host shm put+get >= 2x ray-object-store", "dressage-shm", "ray-object-store", 2.0),
    ("same-host shm put+get >= 2x transferqueue", "dressage-shm", "transferqueue", 2.0),
)


def _targets(workloads: list[Workload], by_key: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target over the payloads it is about: every payload of >= 1 MiB (large ones and step R3)."""
    counted = [w for w in workloads if w.item_bytes >= MiB]
    out = []
    for name, system, baseline, required in _TARGETS:
        rows = []
        for w in counted:
            mine, base = by_key.get((system, w.name), {}), by_key.get((baseline, w.name), {})
            if "roundtrip_gbps" not in mine or "roundtrip_gbps" not in base:
                why = mine.get("error") or base.get("error") or "not measured"
                rows.append({"workload": w.name, "payload_bytes": w.item_bytes, "ratio": None, "met": None,
                             "error": why})
                continue
            ratio = mine["roundtrip_gbps"] / base["roundtrip_gbps"]
            rows.append({"workload": w.name, "payload_bytes": w.item_bytes, "ratio": ratio,
                         "met": ratio >= required})
        measured = [r for r in rows if r["met"] is not None]
        out.append({
            "target": name,
            "system": system,
            "baseline": baseline,
            "required_ratio": required,
            "met": (all(r["met"] for r in measured) if measured else None),
            "payloads": rows,
        })
    return out


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _environment() -> dict[str, Any]:
    mem_total = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem_total = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    commit, dirty = None, None
    try:
        here = Path(__file__).resolve().parent
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                                text=True, timeout=5).stdout.strip() or None
        if commit:
            # Figures of a working tree with local edits under src/ are not those of the commit.
            status = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=here.parent,
                                    capture_output=True, text=True, timeout=5).stdout
            dirty = sorted({line[3:] for line in status.splitlines() if line.strip()})[:50]
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "mem_total_bytes": mem_total,
        "loadavg_start": _loadavg(),
        "git_commit": commit,
        "uncommitted_changes": dirty,
        "versions": {d: _version(d) for d in ("dressage", "numpy", "pyzmq", "ray", "torch", "tensordict",
                                              "transferqueue")},
    }


# --- output -----------------------------------------------------------------------------------


def _fmt_bytes(n: int) -> str:
    if n >= MiB:
        return f"{n / MiB:.4g} MiB"
    return f"{n / 1024:g} KiB"


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def format_table(report: dict[str, Any]) -> str:
    """The human table: one row per system and workload, then one line per target."""
    header = ("system", "workload", "payload", "count", "put GB/s", "get GB/s", "put+get GB/s",
              "x memcpy", "x ray", "x tq")
    rows: list[tuple[str, ...]] = []
    for e in report["results"]:
        payload = _fmt_bytes(e["payload_bytes"])
        if "error" in e:
            rows.append((e["system"], e["workload"], payload, str(e["count"]), f"error: {e['error']}"))
            continue
        rows.append((
            e["system"], e["workload"], payload, str(e["count"]),
            _fmt(e["put_gbps"]), _fmt(e["get_gbps"]), _fmt(e["roundtrip_gbps"]),
            _fmt(e.get("ratio_memcpy")), _fmt(e.get("ratio_ray")), _fmt(e.get("ratio_transferqueue")),
        ))
    widths = [len(h) for h in header]
    for row in rows:
        if len(row) == len(header):
            widths = [max(w, len(c)) for w, c in zip(widths, row)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    last_workload = None
    for row in rows:
        if last_workload is not None and row[1] != last_workload:
            lines.append("")
        last_workload = row[1]
        if len(row) == len(header):
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        else:
            lead = "  ".join(c.ljust(w) for c, w in zip(row[:4], widths))
            lines.append(f"{lead}  {row[4]}")
    lines.append("")
    lines.append("GB/s = 1e9 bytes/s, medians of alternating rounds; ratios compare put+get with the "
                 "baseline's, same workload, same run")
    lines.append("dressage gets return read-only views (embedded: of the unit's memory, shm: of its "
                 "segments) rather than copies")
    for t in report["targets"]:
        verdict = {True: "MET", False: "NOT MET", None: "not measured"}[t["met"]]
        figures = ", ".join(
            f"{p['workload']} {_fmt(p['ratio'])}x" for p in t["payloads"] if p["ratio"] is not None
        )
        lines.append(f"target {t['target']}: {verdict}" + (f" ({figures})" if figures else ""))
    return "\n".join(lines)


def write_json(report: dict[str, Any], path: str | os.PathLike[str]) -> None:
    target = Path(path)
    if target.parent and not target.parent.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, target)


def parse_sizes(values: Iterable[str]) -> tuple[float, ...]:
    """``--sizes 1 4 16`` or ``--sizes 1,4,16`` (MiB)."""
    out: list[float] = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip().removesuffix("MiB").removesuffix("M")
            if not part:
                continue
            try:
                out.append(float(part) if "." in part else int(part))
            except ValueError:
                raise ConfigError(f"bench.sizes: {value!r} is not a size in MiB") from None
    return tuple(out)
