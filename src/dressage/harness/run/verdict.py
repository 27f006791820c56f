"""The verdict of ``dressage run``: one PASS / FAIL line computed from what the run measured.

Checks, each only where it applies:
- every agent session finished without an error (the line counts the agents' turns, tool calls,
  retries and context compressions), and the rollouts produced Samples (each of them
  already passed the consumer's :func:`dressage.train.check_sample` on the way);
- with TransferQueue on, no key is left once every batch has been consumed (a StorageUnit that cannot
  be asked fails this check, named: the promise cannot be shown to hold);
- with ``compare_without_tq``, the same seed with TQ off gives the same samples digest;
- with the ``transformers`` engine and R3, the trainer's forced-routing forward pass reproduces the
  recorded logprobs token by token bit for bit and each sequence's total within ``SEQUENCE_TOLERANCE``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dressage.errors import ConfigError
from dressage.harness.run.config import RunConfig

__all__ = ["Verdict", "judge", "run_and_judge", "SEQUENCE_TOLERANCE"]

SEQUENCE_TOLERANCE = 1e-6
"""Largest accepted |sum of replayed logprobs - sum of recorded ones| of one Sample."""


@dataclass(frozen=True, slots=True)
class Verdict:
    passed: tuple[str, ...]
    failed: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def line(self) -> str:
        if self.ok:
            return "PASS: " + ", ".join(self.passed)
        return "FAIL: " + "; ".join(self.failed) + (f" (passed: {', '.join(self.passed)})" if self.passed else "")

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "passed": list(self.passed), "failed": list(self.failed), "line": self.line}


_ACTIVITY = (("turns", "turn", "turns"), ("tool_calls", "tool call", "tool calls"), ("retries", "retry", "retries"),
             ("compressions", "compression", "compressions"))


def _activity(agent: dict[str, Any]) -> str:
    """What the agents did, counted, e.g. `` (62 turns, 19 tool calls, 4 retries, 7 compressions)``:
    the line shows whether a run exercised retries and context compression at all."""
    if "turns" not in agent:
        return ""
    counts = [(int(agent.get(key, 0)), one, many) for key, one, many in _ACTIVITY]
    return " (" + ", ".join(f"{n} {one if n == 1 else many}" for n, one, many in counts) + ")"


def judge(report: Any, baseline: Any = None) -> Verdict:
    """The verdict on ``report`` (a :class:`dressage.harness.run.loop.RunReport`); ``baseline`` is the
    same run with TQ off, when one was made."""
    passed: list[str] = []
    failed: list[str] = []

    def check(ok: bool, good: str, bad: str) -> None:
        (passed if ok else failed).append(good if ok else bad)

    errors = int(report.agent.get("errors", 0))
    from dressage.harness.agents.rollout import first_causes

    causes = getattr(report, "first_errors", None)
    check(errors == 0, f"{report.sessions} sessions without errors{_activity(report.agent)}",
          f"{errors} agent sessions failed" + (f" ({first_causes(causes)})" if causes else ""))
    check(report.segments > 0, f"{report.segments} samples checked", "no Samples reached the trainer")
    if report.config.get("enable_transfer_queue"):
        if report.tq_keys_left is None:
            check(False, "", f"TQ keys left after consumption unknown: {report.tq_keys_uncounted}")
        else:
            check(report.tq_keys_left == 0, "0 TQ keys left", f"{report.tq_keys_left} TQ keys left after consumption")
    if baseline is not None:
        same = baseline.samples_digest == report.samples_digest
        check(same, f"TQ on/off samples identical (digest {report.samples_digest[:8]})",
              f"TQ on/off samples differ (digest {report.samples_digest[:8]} with TQ, "
              f"{baseline.samples_digest[:8]} without)")
    r = report.replay
    if r:
        bit = r["identical_tokens"] == r["tokens"] and r["tokens"] > 0
        check(bit, f"R3 replay reproduces {r['tokens']} logprobs bit for bit",
              f"R3 replay: {r['tokens'] - r['identical_tokens']} of {r['tokens']} logprobs differ "
              f"(max |diff| {r['max_abs_diff']:.3g})")
        check(r["max_sum_abs_diff"] <= SEQUENCE_TOLERANCE,
              f"sequence logprob within {SEQUENCE_TOLERANCE:g}",
              f"R3 replay: a sequence's logprob is off by {r['max_sum_abs_diff']:.3g} (> {SEQUENCE_TOLERANCE:g})")
    return Verdict(tuple(passed), tuple(failed))


def run_and_judge(cfg: RunConfig) -> tuple[Any, Any, Verdict]:
    """Run ``cfg``; with ``cfg.compare_without_tq`` (and TQ on) run it again with TQ off; judge both."""
    from dressage.harness.run.loop import run_pipeline
    from dressage.tq.config import TransferQueueSelection

    compare_without_tq = cfg.compare_without_tq
    if compare_without_tq and not cfg.data_plane.enable_transfer_queue:
        raise ConfigError("--compare-without-tq compares a run with TQ to one without: add --enable-transfer-queue")
    report = run_pipeline(cfg)
    baseline = None
    if compare_without_tq:
        dp = dataclasses.replace(cfg.data_plane, enable_transfer_queue=False, transfer_params=None)
        baseline = run_pipeline(dataclasses.replace(cfg, data_plane=dp, transfer_queue=TransferQueueSelection()))
    return report, baseline, judge(report, baseline)
