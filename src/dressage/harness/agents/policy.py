"""The agents' decisions, with no I/O: retries, follow-up messages, compression, summaries, reward.

Session (group, sample) draws from one RNG seeded by (seed, group, sample), a fixed number of
values per turn whatever the turn does, so the same seed replays the same sessions however the
rollout's concurrency interleaves them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from dressage.harness.agents.prompts import TaskPrompt
from dressage.harness.agents.tools import TOOL_ERROR_PREFIX

if TYPE_CHECKING:  # a type only: AgentConfig.session_agent() reaches this module at run time
    from dressage.harness.agents.config import AgentConfig

__all__ = ["TurnDecision", "SessionPolicy", "needs_compression", "summarize", "score_transcript"]

_FOLLOWUPS = (
    "Good. Now check the {kw} part again.",
    "Continue with the next step.",
    "Explain that result in one sentence.",
    "Use a tool to verify the {kw} figure.",
    "What would change if the {kw} doubled?",
    "List what is still missing.",
    "Compare it with the {kw} we discussed.",
    "Give the final answer and name the {kw}.",
)


@dataclass(frozen=True, slots=True)
class TurnDecision:
    """What the agent does on one turn, decided before the call is made."""

    turn: int
    retry_from: int | None
    """Index, within the current history epoch, of the earlier request to re-send; ``None``: go on."""
    followup: str
    """The user message appended after a reply without tool calls."""
    call_seed: int
    """Per-call sampling seed (sent when ``AgentConfig.send_seed``)."""


class SessionPolicy:
    """The decision stream of one session."""

    def __init__(self, config: AgentConfig, group_index: int, sample_index: int,
                 keywords: Sequence[str] = ()) -> None:
        self.config = config
        self._rng = np.random.default_rng([config.seed, group_index, sample_index])
        self._keywords = tuple(keywords) or ("result",)
        self._turn = 0

    def next_turn(self, retry_candidates: int) -> TurnDecision:
        """Decide the next turn; ``retry_candidates`` earlier requests (indices 1..n of the epoch) can be re-sent.

        Index 0 of an epoch is a root call with no parent step, so re-sending it would start a new
        lineage instead of a branch; only later requests are retry targets.
        """
        u_retry, u_target, u_follow, u_kw = self._rng.random(4)
        call_seed = int(self._rng.integers(0, 2**31 - 1))
        turn, self._turn = self._turn, self._turn + 1
        retry_from = None
        if retry_candidates > 0 and u_retry < self.config.retry_rate:
            retry_from = 1 + min(int(u_target * retry_candidates), retry_candidates - 1)
        template = _FOLLOWUPS[min(int(u_follow * len(_FOLLOWUPS)), len(_FOLLOWUPS) - 1)]
        kw = self._keywords[min(int(u_kw * len(self._keywords)), len(self._keywords) - 1)]
        return TurnDecision(turn=turn, retry_from=retry_from, followup=template.format(kw=kw),
                            call_seed=call_seed)


def needs_compression(config: AgentConfig, prompt_tokens: int, completion_tokens: int) -> bool:
    """True when the last call's context (prompt + completion, as ``usage`` reports it) nears the limit."""
    return prompt_tokens + completion_tokens >= config.compress_at


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def summarize(prompt: TaskPrompt, transcript: Sequence[Mapping[str, Any]], turns: int,
              *, max_chars: int = 400) -> str:
    """The user message that replaces a compressed history: the task plus a digest of the progress."""
    tool_results = [_text(m) for m in transcript if m.get("role") == "tool"][-3:]
    answers = [_text(m) for m in transcript if m.get("role") == "assistant" and _text(m)]
    last = answers[-1][:max_chars].strip() if answers else ""
    parts = [prompt.user, "", f"Summary of the conversation so far ({turns} turns, compressed):"]
    if tool_results:
        parts.append("Tool results: " + "; ".join(r[:80] for r in tool_results))
    if last:
        parts.append("Last answer: " + last)
    parts.append("Continue the task from this summary.")
    return "\n".join(parts)


_WORD = re.compile(r"[a-z0-9]+")


def score_transcript(prompt: TaskPrompt, transcript: Sequence[Mapping[str, Any]]) -> float:
    """Reward in [0, 1], a pure function of the transcript.

    Half for the share of the task's keywords the assistant mentioned, half for the share of
    tool calls that ran without error (all of it for keywords when no tool was called).
    """
    said: set[str] = set()
    for m in transcript:
        if m.get("role") == "assistant":
            said.update(_WORD.findall(_text(m).lower()))
    keywords = [k.lower() for k in prompt.keywords]
    kw_score = sum(1 for k in keywords if set(_WORD.findall(k)) <= said) / len(keywords) if keywords else 0.0
    results = [_text(m) for m in transcript if m.get("role") == "tool"]
    if not results:
        return round(kw_score, 6)
    ok = sum(1 for r in results if not r.startswith(TOOL_ERROR_PREFIX))
    return round(0.5 * kw_score + 0.5 * ok / len(results), 6)
