"""``dressage run``: the main job. Engine + Proxy + TQ + agents -> training readers, on the embedded default."""

from __future__ import annotations

import argparse
import json
import sys

from dressage.cli._dataplane import add_data_plane_args, data_plane_config, transfer_queue_config
from dressage.units import format_bytes


def register(sub: argparse._SubParsersAction) -> None:
    from dressage.flags import add_flags
    from dressage.harness.run.config import RunConfig

    p = sub.add_parser("run", help="run rollout -> train iterations end to end (embedded by default)",
                       description="Agents drive sessions through the Proxy's HTTP server into the built-in "
                                   "SGLang-protocol engine; finalized Segments go through the RolloutManager to DP "
                                   "trainer readers that restore slime's fields; every Sample is checked and the "
                                   "batch's TransferQueue keys are cleared. The last line is the verdict: PASS, "
                                   "or FAIL with a non-zero exit status.")
    g = p.add_argument_group("rollout")
    add_flags(g, RunConfig)
    g.add_argument("--compare-without-tq", action="store_true",
                   help="with TQ on, run the same seed again with TQ off; the verdict requires the same "
                        "samples digest")
    g.add_argument("--json", metavar="PATH", default=None, help="write the report as JSON (default: not written)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_data_plane_args(p)
    p.set_defaults(func=_run)


def run_config(args: argparse.Namespace):
    """The validated :class:`RunConfig` of ``dressage run``'s flags."""
    import dataclasses

    from dressage.flags import from_flags
    from dressage.harness.run.config import TRANSFORMERS_MODEL, RunConfig

    dp = data_plane_config(args)
    if args.engine == "transformers":  # the shape of the model that engine runs
        dp = dataclasses.replace(dp, model=TRANSFORMERS_MODEL)
    return from_flags(RunConfig, args, data_plane=dp, transfer_queue=transfer_queue_config(args),
                      progress=not args.no_progress and sys.stderr.isatty())


def _run(args: argparse.Namespace) -> int:
    from dressage.harness.run.verdict import run_and_judge

    report, baseline, verdict = run_and_judge(run_config(args), compare_without_tq=args.compare_without_tq)
    print(render_report(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**report.to_dict(), "verdict": verdict.to_dict(),
                       "baseline_samples_digest": baseline.samples_digest if baseline is not None else None},
                      f, indent=2)
        print(f"report written to {args.json}")
    print(verdict.line, file=sys.stdout if verdict.ok else sys.stderr)
    return 0 if verdict.ok else 1


def render_report(r) -> str:
    c = r.config
    tq = "on (" + ", ".join(c["transfer_params"]) + ")" if c["enable_transfer_queue"] else "off"
    rows = [
        ("model", c["model"] + (f" (engine: {c['engine']})" if c.get("engine", "builtin") != "builtin" else "")),
        ("R3 / dtype", f"{'on' if c['use_rollout_routing_replay'] else 'off'} / {c['routed_experts_dtype']}"),
        ("TransferQueue", tq),
        ("rollouts x prompts x samples", f"{c['num_rollouts']} x {c['rollout_batch_size']} x {c['n_samples_per_prompt']}"),
        ("sessions", r.sessions),
        ("model calls (steps)", r.steps),
        ("agent turns / tool calls / retries / compressions / errors",
         " / ".join(str(r.agent.get(k, 0)) for k in ("turns", "tool_calls", "retries", "compressions", "errors"))),
        ("segments (samples)", r.segments),
        ("tokens / trained tokens", f"{r.tokens} / {r.trained_tokens}"),
        ("large fields restored", ", ".join(f"{k} {format_bytes(v)}" for k, v in sorted(r.large_field_bytes.items())) or "-"),
        ("large fields as stored", format_bytes(r.stored_large_field_bytes)),
        ("bytes through RolloutManager", format_bytes(r.rollout_manager_path_bytes)),
        ("TQ bytes written / read", f"{format_bytes(r.tq_bytes_written)} / {format_bytes(r.tq_bytes_read)}"),
        ("TQ keys left", r.tq_keys_left),
    ]
    if r.replay:
        rp = r.replay
        rows.append(("R3 replay (trainer, forced routing)",
                     f"{rp['identical_tokens']} / {rp['tokens']} logprobs bit-identical, max |diff| "
                     f"{rp['max_abs_diff']:.3g}, max sequence |diff| {rp['max_sum_abs_diff']:.3g}"))
    rows += [(f"peak {k}", format_bytes(v)) for k, v in sorted(r.peak_memory_bytes.items())]
    rows += [("samples digest", r.samples_digest[:16] + "..."), ("wall time", f"{r.wall_s:.1f} s")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
