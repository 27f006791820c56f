"""Chat calls -> prompt token ids with TITO reuse, and engine output -> OpenAI assistant messages.

When a request's messages extend an earlier step's messages plus the reply the Proxy returned
for it (compared after the template's normalisation; reasoning may be sent back or dropped), the
prompt is that step's prompt + response ids exactly as the engine produced them, the template glue
after an assistant turn, and the tokens of the new messages only, cut from the real template's
render of the conversation. The history is never re-rendered, so its tokens cannot drift.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from dressage.errors import ChatTemplateError
from dressage.proxy.parsers import ToolCallParser, assistant_message
from dressage.proxy.parsers.hermes import HermesParser
from dressage.trajectory import Session, StepRecord

__all__ = ["ChatPrompt", "build_chat_prompt", "effective_tools", "assistant_message", "ToolCallParser",
           "QwenToolCallParser", "same_message"]

QwenToolCallParser = HermesParser
"""The Hermes / Qwen JSON family (:class:`dressage.proxy.parsers.hermes.HermesParser`)."""

@dataclass(frozen=True, slots=True)
class ChatPrompt:
    prompt_ids: np.ndarray
    base_step: int | None
    """The step whose tokens were reused (``None``: a full render)."""
    boundary_reason: str | None = None
    """Set when TITO was possible in principle but the delta could not be made exactly."""


def _norm_content(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, list):  # OpenAI content parts: keep text parts, in order
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content


def _norm_tool_calls(calls: Any) -> list[tuple[str, Any]]:
    out = []
    for c in calls or ():
        fn = c.get("function", {}) if isinstance(c, dict) else {}
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass
        out.append((fn.get("name"), args))
    return out


def same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal as far as the chat template is concerned (role, text, tool calls, tool result id).

    An assistant reply's surrounding whitespace does not count: its tokens are reused as the
    engine produced them, and a streamed reply's deltas may keep blanks the parser stripped.
    """
    ca, cb = _norm_content(a.get("content")), _norm_content(b.get("content"))
    if a.get("role") == "assistant" and isinstance(ca, str) and isinstance(cb, str):
        ca, cb = ca.strip(), cb.strip()
    return (a.get("role") == b.get("role")
            and ca == cb
            and _norm_tool_calls(a.get("tool_calls")) == _norm_tool_calls(b.get("tool_calls"))
            and a.get("name") == b.get("name"))


def _history(step: StepRecord) -> list[dict[str, Any]] | None:
    reply = step.metadata.get("assistant_message")
    if step.messages is None or reply is None:
        return None
    return [*step.messages, reply]


def _tools_key(tools: Any) -> str:
    return json.dumps(tools or [], sort_keys=True)


def _profile(tokenizer: Any) -> Any:
    """The tokenizer's template profile (``dressage.tokenizer.template``), ``None`` when it has none."""
    try:
        return tokenizer.template_profile
    except (ChatTemplateError, AttributeError):
        return None


def _compare(recorded: dict[str, Any], sent: dict[str, Any], profile: Any) -> str:
    """``same``, ``reasoning`` (only the reasoning sent back differs) or ``differ``.

    Assistant turns are compared after the template's own normalisation: reasoning is read from
    ``reasoning_content`` or a think block in ``content``, and reasoning left out by the agent
    (the usual case: the template drops it anyway) matches whatever the model produced.
    """
    if recorded.get("role") != "assistant" or sent.get("role") != "assistant" or profile is None \
            or not profile.has_reasoning:
        return "same" if same_message(recorded, sent) else "differ"
    r_reason, r_text = profile.split_reasoning(recorded)
    s_reason, s_text = profile.split_reasoning(sent)
    if (r_text != s_text or _norm_tool_calls(recorded.get("tool_calls")) != _norm_tool_calls(sent.get("tool_calls"))
            or recorded.get("name") != sent.get("name")):
        return "differ"
    return "reasoning" if s_reason is not None and r_reason is not None and s_reason != r_reason else "same"


def build_chat_prompt(session: Session, tokenizer: Any, messages: Sequence[dict[str, Any]],
                      tools: Sequence[dict[str, Any]] | None) -> ChatPrompt:
    """Prompt ids for a chat call in ``session`` (TITO where the messages extend a recorded step).

    The continuation (glue + delta) comes from the tokenizer (``Tokenizer.continuation``). A
    boundary is named only when the model would see other tokens than the recorded ones:
    ``tool_schema_change``, ``reasoning_change`` or a template drift class of
    :data:`~dressage.tokenizer.tito.DRIFT_CLASSES`.
    """
    profile = _profile(tokenizer)
    best: StepRecord | None = None
    best_len = -1
    near_miss: str | None = None
    near_at = -1
    # The longest recorded history that the messages extend wins (the earliest step among equals),
    # so candidates are tried longest first and the first match ends the search; a near miss is
    # the one of the latest step that had one (it only counts when nothing matched, and then every
    # candidate was tried).
    candidates = []
    for order, step in enumerate(list(session.steps.values())):  # a snapshot: another call may commit
        hist = _history(step)
        if hist is not None and len(hist) < len(messages):
            candidates.append((order, step, hist))
    candidates.sort(key=lambda c: -len(c[2]))
    tools_key = None
    for order, step, hist in candidates:
        verdicts = {_compare(h, m, profile) for h, m in zip(hist, messages)}
        if "differ" in verdicts:
            continue
        if "reasoning" in verdicts:
            if order > near_at:
                near_miss, near_at = "reasoning_change", order
            continue
        if tools_key is None:
            tools_key = _tools_key(tools)
        if _tools_key(step.tools) != tools_key:
            # The conversation continues but the tools changed: the system turn differs, so
            # the earlier tokens cannot be reused and a new Segment starts.
            if order > near_at:
                near_miss, near_at = "tool_schema_change", order
            continue
        best, best_len = step, len(hist)
        break
    if best is not None:
        cont = tokenizer.continuation(best.full_ids.tolist(), best.response_ids.tolist(), messages,
                                      best_len - 1, tools)
        if cont.ids is None:
            return ChatPrompt(_full(tokenizer, messages, tools), None, cont.drift)
        ids = np.concatenate([best.full_ids, np.asarray(cont.ids, np.int32)])
        return ChatPrompt(ids.astype(np.int32, copy=False), best.step_id)
    return ChatPrompt(_full(tokenizer, messages, tools), None, near_miss)


def effective_tools(tools: Sequence[dict[str, Any]] | None, tool_choice: Any) -> list[dict[str, Any]] | None:
    """The tools the template renders for ``tool_choice``.

    ``"none"`` offers no tool; a named function offers only that one; ``"auto"``,
    ``"required"`` or no choice offer them all (forcing a call needs constrained decoding,
    which is the engine's business, not the template's).
    """
    if not tools:
        return None
    if tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [t for t in tools if (t.get("function") or {}).get("name") == name]
        if not chosen:
            raise ChatTemplateError(f"tool_choice names function {name!r}, which is not in tools")
        return chosen
    return list(tools)


def _full(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any) -> np.ndarray:
    return np.asarray(tokenizer.apply_chat_template(list(messages), tools or None, True), dtype=np.int32)
