"""Token-in-token-out: the ids that continue a recorded call, derived from the real template.

A chat call whose messages extend a recorded call's messages plus its reply gets the prompt
``recorded prompt + response + glue + delta``: the engine's own tokens, never re-rendered. The
glue is what the template writes after an assistant turn that the engine did not emit (the
newline after ``<|im_end|>``, or all of the turn end after a reply cut by length); the delta is
the template's text for the new messages and the generation prompt.

Both come from one render of the conversation as sent, so every template rule that depends on
the position of a message (a think block only on the last assistant turn, reasoning dropped
before the last user query, tool results merged into one turn) is applied in its true context.
The delta is cut right after the recorded assistant turn's end in that render, and accepted only
when it tokenizes on its own exactly as inside the whole text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from dressage.errors import ChatTemplateError

if TYPE_CHECKING:
    from dressage.tokenizer.base import Message, Tokenizer, ToolSpec

__all__ = ["Continuation", "continuation", "glue_after", "DRIFT_CLASSES"]

DRIFT_CLASSES = {
    "tool_schema_change": "the tools differ from the recorded call's: the system turn changes",
    "reasoning_change": "the agent sent back reasoning other than what the model produced",
    "template_turn_end": "the render has no end of the recorded assistant turn where TITO needs it",
    "template_rewrite": "the template renders the new messages only by changing tokens already recorded",
}


@dataclass(frozen=True, slots=True)
class Continuation:
    """Ids to append after the recorded prompt + response, or why there are none."""

    ids: list[int] | None
    glue: int = 0
    """How many of ``ids`` are glue (the rest is the delta)."""
    method: str = "delta"
    """``delta`` (cut from the render) or ``full_render`` (the whole render extends the record)."""
    drift: str | None = None
    """A key of :data:`DRIFT_CLASSES` when ``ids`` is ``None``."""


def glue_after(response_ids: Sequence[int], end_ids: Sequence[int]) -> list[int]:
    """The part of the turn end ``end_ids`` that ``response_ids`` does not already end with."""
    end = list(end_ids)
    n = len(response_ids)
    for k in range(min(n, len(end)), 0, -1):
        if [int(t) for t in response_ids[n - k:]] == end[:k]:
            return end[k:]
    return end


def _glue_text(tok: "Tokenizer", response_ids: Sequence[int], end: str) -> str:
    """The part of the turn end ``end`` that the reply does not already end with.

    Matched on ids first (the engine stopped on the end's special token); then on text, where
    only blanks may be left over: a reply may hold the end marker in other tokens than a fresh
    encoding of ``end`` (a marker that is no special token), but a reply cut by length in the
    middle of a marker's characters gets the whole end.
    """
    end_ids = tok.encode(end)
    n = len(response_ids)
    for k in range(min(n, len(end_ids)), 0, -1):
        if [int(t) for t in response_ids[n - k:]] == end_ids[:k]:
            return tok.decode(end_ids[k:])
    tail = tok.decode([int(t) for t in response_ids[-len(end) - 4:]]) if n else ""
    for k in range(min(len(tail), len(end)), 0, -1):
        if tail.endswith(end[:k]) and not end[k:].strip():
            return end[k:]
    return end


def _nth(text: str, needle: str, n: int) -> int:
    """Index just after the ``n``-th (1-based) occurrence of ``needle``; -1 when there are fewer."""
    pos = 0
    for _ in range(n):
        at = text.find(needle, pos)
        if at < 0:
            return -1
        pos = at + len(needle)
    return pos


def continuation(tok: "Tokenizer", recorded_ids: Sequence[int], response_ids: Sequence[int],
                 messages: Sequence["Message"], reply_index: int,
                 tools: Sequence["ToolSpec"] | None) -> Continuation:
    """Glue + delta ids after ``recorded_ids`` (a call's prompt + ``response_ids``).

    ``messages[reply_index]`` is the assistant message standing for that call's reply; the messages
    after it are new. The delta is cut from the render of all ``messages`` (see the module
    docstring); when that is impossible, the whole render is used if it extends ``recorded_ids``.
    """
    drift = "template_rewrite"
    try:
        profile = tok.template_profile
        text = tok.render_text(messages, tools, True)
    except ChatTemplateError:
        text = None
    if text is not None:
        n_assistant = sum(1 for m in messages[:reply_index + 1] if m.get("role") == "assistant")
        head = _nth(text, profile.assistant_open, n_assistant)
        at = text.find(profile.assistant_end, head) if head >= 0 else -1
        if at < 0:
            drift = "template_turn_end"
        else:
            delta_text = text[at + len(profile.assistant_end):]
            glue_text = _glue_text(tok, response_ids, profile.assistant_end)
            glue = tok.encode(glue_text) if glue_text else []
            delta = tok.encode(delta_text)
            # The cut must fall on a token boundary of the text that follows the reply.
            if tok.encode(glue_text + delta_text) == glue + delta:
                return Continuation(glue + delta, len(glue), "delta")
    full = tok.apply_chat_template(list(messages), tools, True)
    recorded = [int(t) for t in recorded_ids]
    if full[:len(recorded)] == recorded and len(full) > len(recorded):
        return Continuation(full[len(recorded):], 0, "full_render")
    return Continuation(None, drift=drift)
