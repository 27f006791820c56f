"""The user's own agents, framework-agnostic: what one rollout session hands an agent and gets back.

:class:`SessionContext` (the session's base URLs, key, prompt, label), the agent contract
``async (ctx) -> reward``, and :class:`CommandAgent`, a command (a coding CLI) run once per session.
"""

from dressage.agents.external import Agent, CommandAgent, CommandResult, Reward, SessionContext, reward_number

__all__ = ["Agent", "CommandAgent", "CommandResult", "Reward", "SessionContext", "reward_number"]
