"""The simulated agents as the agent of slime's rollout function (``SlimeRollout(agent=...)``).

Turns slime's prompts (a string, or chat messages) into the agents' tasks and runs them with
:func:`~dressage.harness.agents.run_rollout`; a real job passes its own agent instead.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from dressage.errors import ConfigError
from dressage.harness.agents.config import AgentConfig
from dressage.harness.agents.prompts import DEFAULT_SYSTEM, TaskPrompt
from dressage.harness.agents.rollout import RolloutReport, run_rollout

__all__ = ["SimulatedAgent", "prompt_of"]


def prompt_of(prompt: Any, index: int) -> TaskPrompt:
    """A slime prompt (a string, or chat messages) as the agents' task."""
    if isinstance(prompt, str) and prompt.strip():
        return TaskPrompt(index=index, kind="slime", system=DEFAULT_SYSTEM, user=prompt)
    if isinstance(prompt, list) and prompt:
        system = next((m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "system"),
                      DEFAULT_SYSTEM)
        user = next((m.get("content") for m in reversed(prompt) if isinstance(m, dict) and m.get("role") == "user"),
                    None)
        if isinstance(user, str) and user.strip() and isinstance(system, str):
            return TaskPrompt(index=index, kind="slime", system=system, user=user)
    raise ConfigError(f"prompt {index}: expected a non-empty string or chat messages with a user turn, "
                      f"got {str(prompt)[:200]!r}")


class SimulatedAgent:
    """A :class:`~dressage.integrations.slime_rollout.RolloutAgent` made of the simulated agents."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config

    async def __call__(self, proxy_url: str, prompts: Sequence[Any], n_samples_per_prompt: int, *,
                       concurrency: int, token: str | None, metadata: Mapping[str, Any]) -> RolloutReport:
        tasks = [prompt_of(p, i) for i, p in enumerate(prompts)]  # every prompt checked before any request
        return await run_rollout(proxy_url, tasks, n_samples_per_prompt, self.config, concurrency=concurrency,
                                 token=token, metadata=metadata)
