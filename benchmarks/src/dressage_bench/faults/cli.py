"""``dressage bench faults``: the fault, fuzz, soak and load cases, as a table and JSON."""

from __future__ import annotations

import argparse
import json
import sys


def register(benches: argparse._SubParsersAction) -> None:
    p = benches.add_parser("faults", help="fault injection, fuzzing, soak and load against the real processes",
                           description="Kills and stops StorageUnits, takes the engine down, restarts the Proxy "
                                       "from its journal, fuzzes the HTTP API and the ZMQ wire, soaks the main "
                                       "loop and loads one Proxy with hundreds of sessions; each case says "
                                       "passed or not with the figures that decide it.")
    p.add_argument("--json", metavar="FILE", help="write the report")
    p.add_argument("--quick", action="store_true", help="CI sizes: every case in a few minutes together")
    p.add_argument("--cases", nargs="+", metavar="CASE", default=(),
                   help="run only these cases (default: all; see --list)")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--soak-iterations", type=int, default=100,
                   help="iterations of the dressage run loop in the soak (default: %(default)s; fewer with --quick)")
    p.add_argument("--fuzz-inputs", type=int, default=400,
                   help="hostile HTTP requests (and as many ZMQ frames) the fuzzers send (default: %(default)s; fewer with --quick)")
    p.add_argument("--load-sessions", type=int, default=200,
                   help="concurrent agent sessions against one Proxy in the load case (default: %(default)s; fewer with --quick)")
    p.add_argument("--load-rounds", type=int, default=3,
                   help="timed rounds of the load case, each through the Proxy and then straight to the engine, "
                        "after one untimed warm-up round of each (default: %(default)s)")
    p.add_argument("--schema-cases", type=int, default=2000,
                   help="requests schemathesis generates from the Proxy's OpenAPI schema in the schema_fuzz case "
                        "(default: %(default)s; 200 with --quick)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fuzzers and payloads (default: %(default)s)")
    p.add_argument("--plot-dir", metavar="DIR", help="write soak.png (PSS per iteration) when the soak ran")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from dressage_bench.faults.runner import FaultsConfig, load_cases, run_faults

    if args.list:
        print("\n".join(load_cases()))
        return 0
    if args.json:  # before the run, which a report that cannot be written would lose at its end
        from dressage.flags import check_writable

        check_writable(args.json, "--json", make_parents=True)
    cfg = FaultsConfig(quick=args.quick, only=tuple(args.cases), soak_iterations=args.soak_iterations,
                       fuzz_inputs=args.fuzz_inputs, load_sessions=args.load_sessions, seed=args.seed,
                       load_rounds=args.load_rounds,
                       schema_cases=args.schema_cases)
    report = run_faults(cfg, progress=sys.stderr.isatty())
    width = max(len(c["name"]) for c in report["cases"])
    for c in report["cases"]:
        figures = ", ".join(f"{k}={v}" for k, v in c["detail"].items() if not isinstance(v, (dict, list)))[:110]
        print(f"{c['name']:<{width}}  {'PASS' if c['passed'] else 'FAIL'}  {c['seconds']:7.1f} s  {figures}")
    for section in ("soak", "fuzz", "load", "schema"):
        if report[section]:
            print(f"{section}: " + ", ".join(f"{k}={v}" for k, v in report[section].items()))
    print(f"{report['passed']} passed, {report['failed']} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot_dir:
        soak = next((c for c in report["cases"] if c["name"] == "soak"), None)
        if soak is not None and soak["detail"].get("pss_mib_per_iteration"):
            path = plot_soak(soak["detail"], args.plot_dir)
            print(f"soak plot written to {path}")
    return 0 if report["failed"] == 0 else 1


def plot_soak(detail: dict, out_dir: str) -> str:
    """PSS of the ``dressage run`` process after each soak iteration, with its rolling floor."""
    import os

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dressage_bench.faults.soak import floor

    pss = detail["pss_mib_per_iteration"]
    summary = detail["soak"]
    os.makedirs(out_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(range(len(pss)), pss, lw=1, label="PSS after each iteration")
    ax.plot(range(len(pss)), floor(pss), lw=2, label="rolling floor (5 iterations)")
    ax.set_xlabel("iteration of dressage run")
    ax.set_ylabel("MiB")
    ax.set_title(f"soak: {summary['iterations']} iterations, floor slope "
                 f"{summary['memory_slope_bytes_per_iter'] / 1024:.1f} KiB/iteration, "
                 f"{summary['keys_left']} TQ keys left")
    ax.grid(alpha=0.3)
    ax.legend()
    path = os.path.join(out_dir, "soak.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
