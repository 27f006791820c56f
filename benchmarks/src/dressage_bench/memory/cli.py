"""``dressage bench memory``: the parser (every config field a flag) and its entry point."""

from __future__ import annotations

import argparse
import sys

from dressage.errors import ConfigError
from dressage.units import parse_bytes, parse_count

__all__ = ["register"]


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.replace(",", " ").split())
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated integers, got {text!r}") from None


def register(benches: argparse._SubParsersAction) -> None:
    p = benches.add_parser(
        "memory",
        help="master-node trajectory data-plane memory (PSS per component) without and with TQ",
        description=(
            "Runs the same synchronous GRPO-style loop (agents -> Proxy -> RolloutManager -> trainer readers) "
            "without TQ and with TQ on a two-node simulated Ray cluster, for each R3 storage dtype, sampling "
            "the PSS of Proxy, RolloutManager, the master object store, TQ Controller and the master's "
            "StorageUnit on a timer. Prints the seed's component table, M_master peaks and ratios and whether "
            "the targets are met; --json writes every figure, --plot-dir the timeline and batch-size PNGs."
        ),
    )
    p.add_argument("--preset", choices=("small", "full"), default="small",
                   help="small: a check (~40 s per dtype); full: the largest run that fits 24 GiB safely (~16 min) "
                        "(default: %(default)s)")
    p.add_argument("--json", metavar="FILE", help="write the report (a valid `dressage capacity --baseline`)")
    p.add_argument("--plot-dir", metavar="DIR", help="write memory_timeline*.png and memory_batch_sizes.png here")
    p.add_argument("--dtypes", metavar="LIST", help="R3 storage dtypes, comma-separated (default int32,uint16,uint8)")
    g = p.add_argument_group("rollout (defaults from the preset)")
    g.add_argument("--model", metavar="PRESET", help="model shape preset (default qwen3.6-35b-a3b)")
    g.add_argument("--num-rollouts", type=int, metavar="N", help="rollout -> train iterations per run")
    g.add_argument("--rollout-batch-size", type=int, metavar="N", help="prompts per rollout")
    g.add_argument("--n-samples-per-prompt", type=int, metavar="N", help="trajectories per prompt")
    g.add_argument("--context-length", metavar="TOKENS", help="agents' context window, e.g. 8K")
    g.add_argument("--max-turns", type=int, metavar="N", help="model calls per session")
    g.add_argument("--max-tokens", type=int, metavar="N", help="max_tokens per call")
    g.add_argument("--mean-response-tokens", type=int, metavar="N", help="built-in engine's mean reply length")
    g.add_argument("--tool-call-rate", type=float, metavar="X", help="share of replies that are tool calls")
    g.add_argument("--retry-rate", type=float, metavar="X", help="share of turns an agent retries")
    g.add_argument("--concurrency", type=int, metavar="N", help="agent sessions in flight")
    g.add_argument("--dp-size", type=int, metavar="N", help="trainer readers on node 1 (one shard each)")
    g.add_argument("--seed", type=int, metavar="N", help="seed of prompts, agents and engine (default 0)")
    c = p.add_argument_group("cluster and measurement")
    c.add_argument("--object-store-memory", metavar="BYTES", help="object store of each simulated node, e.g. 3GiB")
    c.add_argument("--unit-memory-budget", metavar="BYTES", help="in-memory budget of each StorageUnit")
    c.add_argument("--placement", choices=("spread", "local"),
                   help="spread: keys over every node's StorageUnit (default); local: the master's first")
    c.add_argument("--proxy-deployment", choices=("process", "ray"),
                   help="process: the Proxy outside Ray, drained over /trajectory/read (default); "
                        "ray: a Ray actor pushing each finalized session to the RolloutManager")
    c.add_argument("--read-groups", type=int, metavar="N",
                   help="prompt groups per trajectory read, process deployment (default 1)")
    c.add_argument("--malloc-mmap-threshold", metavar="BYTES",
                   help="MALLOC_MMAP_THRESHOLD_ for the cluster's processes (default 128KiB; 0: glibc default)")
    c.add_argument("--interval-s", type=float, metavar="S", help="sampling period (default 0.15)")
    c.add_argument("--batch-sizes", metavar="LIST", help="batch sizes of the projected peak-vs-batch plot")
    c.add_argument("--host-memory", metavar="BYTES", help="threshold line on that plot (default 24GiB)")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="always show the progress bar (default: only on a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="never show the progress bar")
    p.set_defaults(func=_run)


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in ("model", "num_rollouts", "rollout_batch_size", "n_samples_per_prompt", "max_turns", "max_tokens",
                 "mean_response_tokens", "tool_call_rate", "retry_rate", "concurrency", "dp_size", "seed",
                 "placement", "proxy_deployment", "read_groups", "interval_s"):
        value = getattr(args, name)
        if value is not None:
            out[name] = value
    if args.dtypes is not None:
        out["dtypes"] = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    if args.context_length is not None:
        out["context_length"] = parse_count(args.context_length, "--context-length")
    if args.object_store_memory is not None:
        out["object_store_bytes"] = parse_bytes(args.object_store_memory, "--object-store-memory")
    if args.unit_memory_budget is not None:
        out["unit_memory_budget"] = parse_bytes(args.unit_memory_budget, "--unit-memory-budget")
    if args.malloc_mmap_threshold is not None:
        text = args.malloc_mmap_threshold.strip()
        out["malloc_mmap_threshold"] = 0 if text == "0" else parse_bytes(text, "--malloc-mmap-threshold")
    if args.host_memory is not None:
        out["host_memory_bytes"] = parse_bytes(args.host_memory, "--host-memory")
    if args.batch_sizes is not None:
        out["batch_sizes"] = _ints(args.batch_sizes, "--batch-sizes")
    out["progress"] = sys.stderr.isatty() if args.progress is None else args.progress
    return out


def _run(args: argparse.Namespace) -> int:
    from dressage_bench.memory import MemoryBenchConfig, format_table, run_memory_bench, write_json

    cfg = MemoryBenchConfig.from_preset(args.preset, **_overrides(args))
    report = run_memory_bench(cfg, plot_dir=args.plot_dir)
    if args.json:
        write_json(report, args.json)
    print(format_table(report))
    if args.json:
        print(f"\nwrote {args.json}", file=sys.stderr)
    return 0
