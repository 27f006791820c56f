"""The simulated agents as a per-session agent of slime's rollout function (``SlimeRollout(agent=...)``).

:class:`SimulatedAgent` runs one simulated conversation (multi-turn tool use, retries that branch,
compression that starts new Segments) with the official ``openai`` client on the session's base URL
and returns its reward; ``AgentConfig.session_agent()`` builds it. A real job passes its own agent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai

from dressage.agents import SessionContext
from dressage.errors import ConfigError
from dressage.harness.agents.conversation import Conversation, converse
from dressage.harness.agents.prompts import DEFAULT_SYSTEM, TaskPrompt

if TYPE_CHECKING:  # a type only: AgentConfig.session_agent() imports this module
    from dressage.harness.agents.config import AgentConfig

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
    """``async (ctx) -> reward``: one simulated conversation of ``config`` against ``ctx.base_url``.

    The conversation's decisions are seeded by (``config.seed``, ``ctx.group_index``, the Sample's
    index), so a session replays the same whatever ran beside it.
    """

    def __init__(self, config: "AgentConfig") -> None:
        self.config = config

    async def __call__(self, ctx: SessionContext) -> float:
        cfg = self.config
        task = prompt_of(ctx.prompt, ctx.group_index)
        conv = Conversation(task, cfg, ctx.group_index, 0 if ctx.index is None else int(ctx.index))
        chat = openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0,
                                  timeout=cfg.request_timeout_s)
        try:
            await converse(chat, conv, cfg)
        finally:
            await chat.close()
        return conv.reward()
