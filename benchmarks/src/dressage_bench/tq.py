"""``dressage bench tq``: put/get bandwidth of TransferQueue against memcpy, Ray and ``transferqueue``.

One run measures every system on the same payloads, alternating systems round by round, and reports
medians, the ratio of each system to each baseline, and whether the targets are met:
embedded put+get >= 0.7x memcpy; across processes >= 2x the Ray object store and >= 2x ``transferqueue``
for payloads >= 1 MiB. A system that cannot run here is listed with ``"error"`` instead of figures.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from dressage_bench._systems import BenchSystem, MemcpySystem, Part, SystemUnavailable, Workload
from dressage_bench._timing import RoundTiming, Samples, interleaved
from dressage_bench._tq_report import BASELINES, build_report, environment, format_table, write_json
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
    "dressage-2host",
    "tcp-loopback",
    "ray-object-store",
    "transferqueue",
)

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
    round_mib: float = 16
    """A round of a workload that moves fewer MiB than this repeats it (put, get, release) until it has
    moved this much, and counts the mean of its repeats: one 1 MiB put+get takes ~0.1 ms, which one
    timer tick or page fault on this machine doubles. 0: one pass a round. Every system alike."""
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
        if isinstance(self.round_mib, bool) or not isinstance(self.round_mib, (int, float)) \
                or not 0 <= self.round_mib <= 4096:
            raise ConfigError(f"bench.round_mib: expected MiB in [0, 4096], got {self.round_mib!r}")
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

    def repeats(self, workload: Workload) -> int:
        """Passes of ``workload`` in one round (see ``round_mib``)."""
        return max(1, math.ceil(self.round_mib * MiB / workload.total_bytes)) if self.round_mib else 1

    @classmethod
    def quick_preset(cls, **overrides: Any) -> "TqBenchConfig":
        """Small sizes and few rounds: about 80 s on 2 cores, cluster start included."""
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
    from dressage_bench._ray import BenchCluster

    largest = max(w.total_bytes for w in workloads)
    # Ray spills when a store holds less than 2-3x the largest object; give each node 3x a round.
    return BenchCluster(object_store_bytes=max(512 * MiB, 3 * largest + 128 * MiB))


def _factories(config: TqBenchConfig, workloads: Sequence[Workload],
               cluster: Any) -> dict[str, Callable[[], BenchSystem]]:
    from dressage_bench import _dressage, _ray, _tcp

    budget = _dressage.tq_budget_bytes(max(w.total_bytes for w in workloads))
    options = dict(config.tq_options)
    factories: dict[str, Callable[[], BenchSystem]] = {
        "memcpy": lambda: MemcpySystem(config.seed),
        "dressage-embedded": lambda: _dressage.DressageEmbeddedSystem(budget, config.seed, options=options),
        "dressage-zmq": lambda: _dressage.DressageAcrossSystem(cluster, budget, config.seed, shm=False,
                                                               options=options),
        "dressage-shm": lambda: _dressage.DressageAcrossSystem(cluster, budget, config.seed, shm=True,
                                                               options=options),
        "dressage-2host": lambda: _dressage.DressageAcrossSystem(cluster, budget, config.seed, shm=True,
                                                                 writer_elsewhere=True, options=options),
        "tcp-loopback": lambda: _tcp.TcpLoopbackSystem(config.seed),
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
    env_start = environment()
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
    return build_report(config, workloads, runs, env_start)


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


def _mean_round(system: BenchSystem, workload: Workload, reps: int) -> RoundTiming:
    if reps == 1:
        return system.run_round(workload)
    put = get = 0.0
    for _ in range(reps):
        t = system.run_round(workload)
        put, get = put + t.put_s, get + t.get_s
    return RoundTiming(put / reps, get / reps)


def _measure(workload: Workload, live: list[_Run], config: TqBenchConfig, bar: Any) -> None:
    reps = config.repeats(workload)
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
                for _ in range(reps):
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
            run.samples[workload.name].add(_mean_round(_system(run), workload, reps))
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
