"""``dressage bench``: measurements, one sub-subcommand each (``dressage bench tq``, ...).

A benchmark joins by adding a ``"module:function"`` entry to :data:`BENCHES`; the function receives the
``bench`` subparsers and adds its parser with ``func(args) -> int`` set, as the top-level commands do.
"""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["BENCHES", "register", "register_tq"]

# Sub-subcommand registrars, in the order `dressage bench --help` lists them.
BENCHES: tuple[str, ...] = ("dressage_bench.cli:register_tq", "dressage_bench.memory.cli:register",
                            "dressage_bench.faults.cli:register", "dressage_bench.scale:register")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks: TransferQueue bandwidth, data-plane memory, faults, scale curves",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    benches = p.add_subparsers(dest="bench", metavar="BENCH")
    benches.required = True
    missing = []
    for entry in BENCHES:
        module, _, func = entry.partition(":")
        try:
            registrar = getattr(importlib.import_module(module), func)
        except ImportError as exc:
            # One benchmark whose module cannot load (an optional dependency, a partial install) must
            # not take `dressage bench tq`, or the whole `dressage` command, down with it.
            missing.append(f"  {module}: {exc}")
            continue
        registrar(benches)
    if missing:
        p.epilog = "unavailable benchmarks:\n" + "\n".join(missing)


def register_tq(benches: argparse._SubParsersAction) -> None:
    from dressage_bench.tq import SYSTEMS

    p = benches.add_parser(
        "tq",
        help="put/get bandwidth of TransferQueue vs memcpy, the Ray object store and transferqueue",
        description=(
            "Measures put and get bandwidth of dressage.tq (embedded and across processes) for 1-256 MiB "
            "payloads and many small per-step puts, with numpy memcpy, the Ray object store across two "
            "simulated nodes and the public transferqueue package as baselines in the same run. Prints a "
            "table with ratios and whether the targets are met; --json writes every figure."
        ),
    )
    p.add_argument("--json", metavar="FILE", help="write the full report (results, ratios, targets, environment)")
    p.add_argument("--quick", action="store_true", help="small sizes, few rounds: about 80 s on 2 cores, cluster start included")
    p.add_argument("--sizes", nargs="+", metavar="MIB",
                   help="large payload sizes in MiB (default 1 4 16 64 256; quick: 1 16)")
    p.add_argument("--rounds", type=int, metavar="N", help="timed rounds per system and payload (default 5; quick: 3)")
    p.add_argument("--warmup", type=int, metavar="N", help="untimed rounds first (default 1)")
    p.add_argument("--round-mib", type=float, metavar="MIB",
                   help="a round repeats a smaller workload until it moved this much, timing the mean "
                        "(default 16; 0: one pass a round)")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, metavar="SYSTEM",
                   help=f"systems to run (default all: {' '.join(SYSTEMS)})")
    p.add_argument("--small-r3-count", type=int, metavar="N",
                   help="separate puts of one 4K-token step's R3 (1.25 MiB) per round (default 64; quick: 16; 0: skip)")
    p.add_argument("--small-logprobs-count", type=int, metavar="N",
                   help="separate puts of one step's logprobs (16 KiB) per round (default 256; quick: 64; 0: skip)")
    p.add_argument("--small-step-count", type=int, metavar="N",
                   help="steps written whole, R3 + logprobs in one call, per round (default 64; quick: 16; 0: skip)")
    p.add_argument("--tq-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a TransferQueue setting for the dressage systems, e.g. checksums=false (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random payloads (default: %(default)s)")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="always show the progress bar (default: only on a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="never show the progress bar")
    p.set_defaults(func=_run_tq)


def _run_tq(args: argparse.Namespace) -> int:
    from dressage_bench.tq import TqBenchConfig, format_table, parse_sizes, run_tq_bench, write_json

    overrides: dict[str, object] = {"seed": args.seed, "progress": args.progress}
    if args.sizes is not None:
        overrides["sizes_mib"] = parse_sizes(args.sizes)
    for name in ("rounds", "warmup", "round_mib", "small_r3_count", "small_logprobs_count", "small_step_count"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    if args.systems:
        overrides["systems"] = tuple(dict.fromkeys(args.systems))
    if args.tq_set:
        overrides["tq_options"] = _settings(args.tq_set)
    config = TqBenchConfig.quick_preset(**overrides) if args.quick else TqBenchConfig(**overrides)
    report = run_tq_bench(config)
    if args.json:
        write_json(report, args.json)
    print(format_table(report))
    if args.json:
        print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


def _settings(pairs: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` pairs, each value read as a YAML scalar (``false``, ``512MiB``, ``2``)."""
    import yaml

    from dressage.errors import ConfigError

    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--tq-set: expected KEY=VALUE, got {pair!r}")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--tq-set {key.strip()}: {value!r} is not a YAML value: {exc}") from exc
    return out
