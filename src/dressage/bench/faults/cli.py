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
    p.add_argument("--cases", nargs="+", metavar="CASE", default=(), help="run only these cases")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--soak-iterations", type=int, default=100)
    p.add_argument("--fuzz-inputs", type=int, default=400)
    p.add_argument("--load-sessions", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from dressage.bench.faults.runner import FaultsConfig, load_cases, run_faults

    if args.list:
        print("\n".join(load_cases()))
        return 0
    cfg = FaultsConfig(quick=args.quick, only=tuple(args.cases), soak_iterations=args.soak_iterations,
                       fuzz_inputs=args.fuzz_inputs, load_sessions=args.load_sessions, seed=args.seed)
    report = run_faults(cfg, progress=sys.stderr.isatty())
    width = max(len(c["name"]) for c in report["cases"])
    for c in report["cases"]:
        figures = ", ".join(f"{k}={v}" for k, v in c["detail"].items() if not isinstance(v, (dict, list)))[:110]
        print(f"{c['name']:<{width}}  {'PASS' if c['passed'] else 'FAIL'}  {c['seconds']:7.1f} s  {figures}")
    for section in ("soak", "fuzz", "load"):
        if report[section]:
            print(f"{section}: " + ", ".join(f"{k}={v}" for k, v in report[section].items()))
    print(f"{report['passed']} passed, {report['failed']} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if report["failed"] == 0 else 1
