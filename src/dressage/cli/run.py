"""``dressage run``: the main job. Engine + Proxy + TQ + agents -> training readers, on the embedded default."""

from __future__ import annotations

import argparse
import json
import sys

from dressage.errors import DressageError, LostSamplesError
from dressage.flags import check_writable
from dressage.units import format_bytes


def _tree():
    from dressage.flags import ConfigTree
    from dressage.harness.run.config import RunConfig

    # run starts its own TransferQueue and trains in its own processes: joining a running one, or writing
    # its client spec for others to join, is the Proxy's option only (RunConfig refuses either in YAML).
    return ConfigTree(RunConfig, omit=("transfer_queue.spec", "transfer_queue.spec_out"))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run rollout -> train iterations end to end (embedded by default)",
                       description="Agents drive sessions through the Proxy's HTTP server into the built-in "
                                   "SGLang-protocol engine; finalized Segments go through the RolloutManager to DP "
                                   "trainer readers that restore slime's fields; every Sample is checked and the "
                                   "batch's TransferQueue keys are cleared. The last line is the verdict: PASS, "
                                   "or FAIL with a non-zero exit status.")
    _tree().add_to(p)
    p.set_defaults(func=_run)


def run_config(args: argparse.Namespace):
    """The validated :class:`RunConfig` of ``dressage run``'s flags (and ``--config`` file)."""
    from dressage.fields.config import TRANSFORMERS_MODEL

    tree = _tree()
    values = tree.values(args)
    extra: dict = {}
    if values.get("inference", {}).get("backend") == "transformers":  # the shape of the model that engine runs
        extra["data_plane.model"] = TRANSFORMERS_MODEL
    extra["report.progress"] = values.get("report", {}).get("progress", True) and sys.stderr.isatty()
    return tree.build(values, **extra)


def _run(args: argparse.Namespace) -> int:
    from dressage.harness.run.verdict import run_and_judge

    cfg = run_config(args)
    for path, where in ((cfg.report.json, "report.json (--json)"), (cfg.report.html, "report.html (--html)")):
        if path:  # before the run, which a report that cannot be written would throw away at its end
            check_writable(path, where, make_parents=True)
    try:
        report, baseline, verdict = run_and_judge(cfg)
    except DressageError as exc:
        if cfg.report.json:  # the cause goes to --json too, not only to stderr (where main prints it)
            with open(cfg.report.json, "w") as f:
                json.dump({"verdict": {"ok": False, "passed": [], "failed": [str(exc)], "line": f"FAIL: {exc}"},
                           "error": {"code": exc.code, "message": str(exc)}}, f, indent=2)
        if isinstance(exc, LostSamplesError):  # the run lost data: a FAIL verdict, not a usage error
            print(f"FAIL: {exc}", file=sys.stderr)
            return 1
        raise
    print(render_report(report))
    if cfg.report.json:
        with open(cfg.report.json, "w") as f:
            json.dump({**report.to_dict(), "verdict": verdict.to_dict(),
                       "baseline_samples_digest": baseline.samples_digest if baseline is not None else None},
                      f, indent=2)
        print(f"report written to {cfg.report.json}")
    if cfg.report.html:
        print(f"session viewer written to {write_run_page(report, cfg.report.html, cfg.report.figures)}")
    print(verdict.line, file=sys.stdout if verdict.ok else sys.stderr)
    return 0 if verdict.ok else 1


def write_run_page(r, path: str, figures=()) -> str:
    """The run's session viewer: the last rollout's sessions, the memory timeline, the capacity figures."""
    from dressage.export import write_html

    capacity = {f"peak {k}": format_bytes(v) for k, v in sorted(r.peak_memory_bytes.items())}
    capacity.update({"large fields as stored": format_bytes(r.stored_large_field_bytes),
                     "TQ bytes written / read": f"{format_bytes(r.tq_bytes_written)} / {format_bytes(r.tq_bytes_read)}",
                     "TQ keys left": r.tq_keys_left if r.tq_keys_left is not None else keys_left_text(r),
                     "segments": r.segments, "trained tokens": r.trained_tokens})
    timeline = [{"label": f"rollout {x['rollout']}", "bytes": x["pss_bytes"]} for x in r.rollouts if "pss_bytes" in x]
    return str(write_html(r.session_views, path, title="dressage run", figures=figures, capacity=capacity,
                          timeline=timeline))


def keys_left_text(r) -> str:
    """The report's TQ keys left, or why they could not be counted."""
    return str(r.tq_keys_left) if r.tq_keys_left is not None else f"unknown ({r.tq_keys_uncounted})"


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
        ("TQ keys left", keys_left_text(r)),
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
