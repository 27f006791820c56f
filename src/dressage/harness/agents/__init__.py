"""Agents: a workload driver that runs many concurrent agent sessions against the Proxy.

Each session is an official ``openai`` client on the session's base URL: multi-turn tool use,
retries that branch, context compression that starts new Segments, and a reward at finalize.
"""

from dressage.harness.agents.client import ChatReply, ProxyClient, ToolCall, error_kind, parse_completion
from dressage.harness.agents.config import AgentConfig
from dressage.harness.agents.conversation import ChatRequestPlan, Conversation
from dressage.harness.agents.policy import SessionPolicy, TurnDecision, needs_compression, score_transcript, summarize
from dressage.harness.agents.prompts import TaskPrompt, as_task_prompt, make_prompts
from dressage.harness.agents.rollout import RolloutReport, SessionResult, run_rollout, run_session
from dressage.harness.agents.tools import TOOL_SPECS, ToolResult, execute_tool

__all__ = [
    "AgentConfig", "run_rollout", "run_session", "RolloutReport", "SessionResult",
    "TaskPrompt", "make_prompts", "as_task_prompt",
    "Conversation", "ChatRequestPlan", "SessionPolicy", "TurnDecision", "needs_compression", "summarize",
    "score_transcript", "TOOL_SPECS", "ToolResult", "execute_tool",
    "ProxyClient", "ChatReply", "ToolCall", "error_kind", "parse_completion",
]
