"""One agent's conversation as a state machine with no I/O: next request, observe the reply.

The driver alternates ``next_request()`` and ``observe(reply)``; tests feed replies by hand.
Tool calls are answered with ``role: tool`` messages, other replies with a follow-up user turn;
retries re-send an earlier request of the current epoch, compression starts a new epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dressage.errors import SessionStateError
from dressage.harness.agents.client import ChatReply, ProxyClient
from dressage.harness.agents.policy import SessionPolicy, TurnDecision, needs_compression, score_transcript, summarize
from dressage.harness.agents.prompts import TaskPrompt
from dressage.harness.agents.tools import TOOL_SPECS, execute_tool

if TYPE_CHECKING:  # a type only: AgentConfig.session_agent() reaches this module at run time
    from dressage.harness.agents.config import AgentConfig

__all__ = ["Conversation", "ChatRequestPlan", "converse"]

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ChatRequestPlan:
    """The arguments of the next ``chat.completions.create`` call and the decision behind them."""

    messages: list[Message]
    tools: tuple[dict[str, Any], ...] | None
    seed: int | None
    decision: TurnDecision


class Conversation:
    """The state of one session: history, the current epoch's requests, counters, transcript."""

    def __init__(self, prompt: TaskPrompt, config: AgentConfig, group_index: int, sample_index: int) -> None:
        self.prompt, self.config = prompt, config
        self.policy = SessionPolicy(config, group_index, sample_index, prompt.keywords)
        self.system: Message = {"role": "system", "content": prompt.system}
        first: Message = {"role": "user", "content": prompt.user}
        self.messages: list[Message] = [self.system, first]
        self.transcript: list[Message] = [self.system, first]
        """Every message in the order it happened, across retries and compressions (the reward reads it)."""
        self._epoch: list[list[Message]] = []   # requests sent since the last compression
        self._pending: ChatRequestPlan | None = None
        self.turns = self.retries = self.compressions = self.tool_calls = self.tool_errors = 0
        self.prompt_tokens = self.completion_tokens = 0
        self.end_reason: str | None = None
        """``max_turns`` or ``context_limit`` once the conversation is over."""

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    def next_request(self) -> ChatRequestPlan:
        """Decide and build the next call; call ``observe`` with its reply before asking again."""
        if self.done:
            raise SessionStateError(f"the conversation ended ({self.end_reason}); no more requests")
        if self._pending is not None:
            raise SessionStateError("the previous request has no observed reply yet")
        decision = self.policy.next_turn(retry_candidates=max(0, len(self._epoch) - 1))
        if decision.retry_from is not None:
            messages = self._epoch[decision.retry_from]
            # The retried call replaces the turns after it: the agent continues from the new reply.
            del self._epoch[decision.retry_from:]
            self.retries += 1
        else:
            messages = list(self.messages)
        self._epoch.append(messages)
        self._pending = ChatRequestPlan(
            messages=messages, tools=TOOL_SPECS if self.config.tools else None,
            seed=decision.call_seed if self.config.send_seed else None, decision=decision)
        return self._pending

    def observe(self, reply: ChatReply) -> None:
        """Take the reply to the pending request: append it, answer its tool calls or follow up."""
        plan, self._pending = self._pending, None
        if plan is None:
            raise SessionStateError("observe() without a pending request")
        self.turns += 1
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens
        history = list(plan.messages)
        history.append(reply.message)
        self.transcript.append(reply.message)
        if reply.tool_calls:
            for call in reply.tool_calls:
                result = execute_tool(call.name, call.arguments)
                self.tool_calls += 1
                self.tool_errors += not result.ok
                tool_msg: Message = {"role": "tool", "tool_call_id": call.id, "content": result.content}
                history.append(tool_msg)
                self.transcript.append(tool_msg)
        else:
            follow: Message = {"role": "user", "content": plan.decision.followup}
            history.append(follow)
            self.transcript.append(follow)
        self.messages = history
        if self.turns >= self.config.max_turns:
            self.end_reason = "max_turns"
        elif needs_compression(self.config, reply.prompt_tokens, reply.completion_tokens):
            if not self.config.compression or len(plan.messages) <= 2:
                # Already as short as a summary would make it (or compression is off): stop here.
                self.end_reason = "context_limit"
            else:
                self._compress()

    def _compress(self) -> None:
        summary: Message = {"role": "user", "content": summarize(self.prompt, self.transcript, self.turns)}
        self.messages = [self.system, summary]
        self.transcript.append(summary)
        self._epoch = []
        self.compressions += 1

    def reward(self) -> float:
        return score_transcript(self.prompt, self.transcript)


async def converse(chat: Any, conv: Conversation, config: "AgentConfig") -> None:
    """Run ``conv`` to its end against the chat client ``chat`` (one call per planned request)."""
    while not conv.done:
        plan = conv.next_request()
        reply = await ProxyClient.complete(chat, model=config.model, messages=plan.messages, tools=plan.tools,
                                           temperature=config.temperature, max_tokens=config.max_tokens,
                                           seed=plan.seed)
        conv.observe(reply)
