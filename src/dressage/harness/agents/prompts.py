"""Task prompts for rollouts: ``make_prompts(n, seed)`` gives varied, reproducible tasks.

Each ``TaskPrompt`` carries the keywords the reward looks for, and optional background text so
that prompt lengths vary the way real agent tasks do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dressage.errors import ConfigError
from dressage.harness.agents.tools import LOOKUP_TABLE

__all__ = ["TaskPrompt", "make_prompts", "as_task_prompt", "DEFAULT_SYSTEM"]

DEFAULT_SYSTEM = "You are a careful assistant. Use the tools when they help, and answer concisely."

_SYSTEMS = {
    "arithmetic": "You are a math assistant. Check every number with the calculator before you answer.",
    "lookup": "You are a research assistant. Look facts up instead of recalling them.",
    "planning": "You are a planning assistant. Break the task into steps and keep track of each one.",
    "review": "You are a code reviewer. Point out problems and propose small, exact fixes.",
    "summary": "You are an analyst. Summarise the material faithfully and state what is uncertain.",
}
KINDS = tuple(_SYSTEMS)

_TOPICS = (
    "batch", "cache", "expert", "layer", "memory", "model", "policy", "query", "reward", "route",
    "segment", "state", "step", "storage", "token", "value", "agent", "data", "file", "test",
)
_FILLER = (
    "the system records every step and keeps the data for training while the agent works on the next "
    "part of the task so that each result can be checked later against the plan and the expected value"
).split()
_VERBS = ("adds", "takes away", "multiplies it by", "divides it by")


@dataclass(frozen=True, slots=True)
class TaskPrompt:
    """One task: the system and first user message of every session sampled from it."""

    index: int
    kind: str
    system: str
    user: str
    keywords: tuple[str, ...] = ()
    """Words a good transcript mentions; part of the reward."""


def as_task_prompt(prompt: TaskPrompt | str, index: int) -> TaskPrompt:
    """A plain string becomes a task with the default system message and its own words as keywords."""
    if isinstance(prompt, TaskPrompt):
        return prompt
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError(f"prompts[{index}] must be a TaskPrompt or a non-empty string, got {prompt!r}")
    words = [w.strip(".,;:?!").lower() for w in prompt.split()]
    keywords = tuple(dict.fromkeys(w for w in words if len(w) > 3))[:3]
    return TaskPrompt(index=index, kind="custom", system=DEFAULT_SYSTEM, user=prompt, keywords=keywords)


def _background(rng: np.random.Generator, max_words: int) -> str:
    n = int(rng.integers(0, max_words + 1)) if max_words > 0 else 0
    if n == 0:
        return ""
    words = [_FILLER[int(i)] for i in rng.integers(0, len(_FILLER), size=n)]
    return "\n\nBackground: " + " ".join(words) + "."


def _task(kind: str, rng: np.random.Generator) -> tuple[str, tuple[str, ...]]:
    topics = tuple(str(t) for t in rng.choice(_TOPICS, size=3, replace=False))
    if kind == "arithmetic":
        a, b = int(rng.integers(2, 1000)), int(rng.integers(2, 100))
        verb = _VERBS[int(rng.integers(len(_VERBS)))]
        return (f"The {topics[0]} budget starts at {a} units and the {topics[1]} {verb} {b}. "
                f"Compute the result, then explain what it means for the {topics[2]}.", topics)
    if kind == "lookup":
        keys = sorted(LOOKUP_TABLE)
        key = keys[int(rng.integers(len(keys)))]
        return (f"Find the value of {key.replace('_', ' ')} and relate it to the {topics[0]} and "
                f"{topics[1]} of our system.", (key.split("_")[0], topics[0], topics[1]))
    if kind == "planning":
        steps = int(rng.integers(3, 8))
        return (f"Plan {steps} steps to migrate the {topics[0]} {topics[1]} without losing any "
                f"{topics[2]}. Number the steps.", topics)
    if kind == "review":
        return (f"Review this change: the {topics[0]} module now caches every {topics[1]} and never "
                f"clears the {topics[2]}. What can go wrong?", topics)
    return (f"Summarise the trade-offs between a large {topics[0]} and a small {topics[1]} for the "
            f"{topics[2]} path.", topics)


def make_prompts(n: int, seed: int = 0, *, max_background_words: int = 120) -> list[TaskPrompt]:
    """``n`` tasks of mixed kinds; the same (n, seed) always gives the same list."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"make_prompts: n must be an integer >= 0, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"make_prompts: seed must be an integer >= 0, got {seed!r}")
    if isinstance(max_background_words, bool) or not isinstance(max_background_words, int) \
            or max_background_words < 0:
        raise ConfigError(f"make_prompts: max_background_words must be >= 0, got {max_background_words!r}")
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i, 0x50524F4D])  # one stream per prompt: a prefix of n is stable
        kind = KINDS[int(rng.integers(len(KINDS)))]
        user, keywords = _task(kind, rng)
        out.append(TaskPrompt(index=i, kind=kind, system=_SYSTEMS[kind],
                              user=user + _background(rng, max_background_words), keywords=keywords))
    return out
