"""``dressage run``: the main job. Engine + Proxy + TQ + agents -> training readers, on the embedded default."""

from __future__ import annotations

import argparse
import json
import sys

from dressage.cli._dataplane import add_data_plane_args, data_plane_config, transfer_queue_config
from dressage.units import format_bytes, parse_count


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run rollout -> train iterations end to end (embedded by default)",
                       description="Agents drive sessions through the Proxy's HTTP server into the built-in "
                                   "SGLang-protocol engine; finalized Segments go through the RolloutManager to DP "
                                   "trainer readers that restore slime's fields; every Sample is checked and the "
                                   "batch's TransferQueue keys are cleared.")
    g = p.add_argument_group("rollout")
    g.add_argument("--num-rollouts", type=int, default=2)
    g.add_argument("--rollout-batch-size", type=int, default=4, help="prompts per rollout")
    g.add_argument("--n-samples-per-prompt", type=int, default=2)
    g.add_argument("--context-length", default="4K", help="agents' context window, e.g. 4K, 32K (default: 4K)")
    g.add_argument("--dp-size", type=int, default=2)
    g.add_argument("--max-turns", type=int, default=4, help="model calls per session")
    g.add_argument("--max-tokens", type=int, default=128, help="max_tokens per call")
    g.add_argument("--mean-response-tokens", type=int, default=64, help="built-in engine's mean reply length")
    g.add_argument("--tool-call-rate", type=float, default=0.4)
    g.add_argument("--retry-rate", type=float, default=0.1)
    g.add_argument("--concurrency", type=int, default=64)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--engine-url", default=None, help="use this SGLang server instead of the built-in engine")
    g.add_argument("--ray", action="store_true", help="RolloutManager and trainer readers as Ray actors")
    g.add_argument("--ray-address", default=None, help="join this Ray cluster (implies --ray)")
    g.add_argument("--json", metavar="PATH", default=None, help="write the report as JSON")
    g.add_argument("--no-progress", action="store_true")
    add_data_plane_args(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from dressage.run import RunConfig, run_pipeline

    cfg = RunConfig(
        data_plane=data_plane_config(args), transfer_queue=transfer_queue_config(args),
        num_rollouts=args.num_rollouts, rollout_batch_size=args.rollout_batch_size,
        n_samples_per_prompt=args.n_samples_per_prompt,
        context_length=parse_count(args.context_length, "--context-length"), dp_size=args.dp_size,
        max_turns=args.max_turns, max_tokens=args.max_tokens, mean_response_tokens=args.mean_response_tokens,
        tool_call_rate=args.tool_call_rate, retry_rate=args.retry_rate, concurrency=args.concurrency,
        seed=args.seed, engine_url=args.engine_url, ray=args.ray, ray_address=args.ray_address,
        progress=not args.no_progress and sys.stderr.isatty())
    report = run_pipeline(cfg)
    print(render_report(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
        print(f"report written to {args.json}")
    if report.tq_keys_left:
        print(f"error: {report.tq_keys_left} TransferQueue keys left after consumption", file=sys.stderr)
        return 1
    return 0


def render_report(r) -> str:
    c = r.config
    tq = "on (" + ", ".join(c["transfer_params"]) + ")" if c["enable_transfer_queue"] else "off"
    rows = [
        ("model", c["model"]),
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
    rows += [(f"peak {k}", format_bytes(v)) for k, v in sorted(r.peak_memory_bytes.items())]
    rows += [("samples digest", r.samples_digest[:16] + "..."), ("wall time", f"{r.wall_s:.1f} s")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
