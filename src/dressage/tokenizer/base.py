"""The ``Tokenizer`` interface the Proxy and the engine share: ids, special tokens, chat template.

Backends implement a small core (encode, decode, special ids, ``apply_chat_template``); the
TITO helpers (the template profile, the glue after an assistant turn, ``render_delta``) are built on
that core once here; :mod:`dressage.tokenizer.tito` derives the ids that continue a recorded call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from dressage.errors import ChatTemplateError
from dressage.tokenizer.template import TemplateProfile, derive_profile

if TYPE_CHECKING:
    from dressage.tokenizer.tito import Continuation

__all__ = ["Tokenizer", "Message", "ToolSpec"]

Message = Mapping[str, Any]
"""An OpenAI-style chat message: ``role``, ``content`` and, for assistants, ``tool_calls``."""
ToolSpec = Mapping[str, Any]
"""An OpenAI-style tool: ``{"type": "function", "function": {"name", "description", "parameters"}}``."""


class Tokenizer(ABC):
    """Text <-> token ids plus the chat template that turns messages into a prompt.

    ``eos_token_id`` ends a document; ``im_end_token_id`` ends a chat turn and is what a chat
    model emits to stop (for Qwen-style templates both are stop tokens of a generation).
    """

    name: str = "tokenizer"

    # -- core: every backend implements these --------------------------------------------------

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it become their special ids."""

    @abstractmethod
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; with ``skip_special_tokens`` the control tokens are left out."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids (every id is in ``[0, vocab_size)``)."""

    @property
    @abstractmethod
    def eos_token_id(self) -> int:
        """End-of-text id."""

    @property
    @abstractmethod
    def im_start_token_id(self) -> int:
        """Id that opens a chat turn (``<|im_start|>``)."""

    @property
    @abstractmethod
    def im_end_token_id(self) -> int:
        """Id that closes a chat turn (``<|im_end|>``)."""

    @abstractmethod
    def apply_chat_template(self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None = None,
                            add_generation_prompt: bool = True) -> list[int]:
        """Prompt ids for ``messages`` (and ``tools``, rendered into the system turn).

        With ``add_generation_prompt`` the ids end with the opening of an assistant turn.
        Raises :class:`~dressage.errors.ChatTemplateError` for messages the template cannot render.
        """

    def render_text(self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None = None,
                    add_generation_prompt: bool = True) -> str:
        """The prompt as text (what :meth:`apply_chat_template` tokenizes).

        Backends that render only ids raise :class:`~dressage.errors.ChatTemplateError`; TITO
        then compares whole renders instead of cutting a delta.
        """
        raise ChatTemplateError(f"tokenizer {self.name!r} renders token ids only")

    @property
    def template_source(self) -> str | None:
        """The chat template's source text, where the backend has one (a Jinja template)."""
        return None

    # -- built on the core -------------------------------------------------------------------

    @property
    def template_profile(self) -> "TemplateProfile":
        """How the template frames turns (:mod:`dressage.tokenizer.template`), probed once."""
        cached = self.__dict__.get("_template_profile")
        if cached is None:
            cached = self.__dict__["_template_profile"] = derive_profile(self, self.profile_name)
        return cached

    def continuation(self, recorded_ids: Sequence[int], response_ids: Sequence[int],
                     messages: Sequence[Message], reply_index: int,
                     tools: Sequence[ToolSpec] | None = None) -> "Continuation":
        """TITO's glue + delta after a recorded call (:func:`dressage.tokenizer.tito.continuation`)."""
        from dressage.tokenizer.tito import continuation
        return continuation(self, recorded_ids, response_ids, messages, reply_index, tools)

    profile_name: str | None = None
    """The template family's name when the backend knows it; ``None``: read from the template."""

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end a generation by default (end of turn first, then end of text)."""
        ids = (self.im_end_token_id, self.eos_token_id)
        return tuple(dict.fromkeys(ids))

    @property
    def special_token_ids(self) -> frozenset[int]:
        return frozenset((self.eos_token_id, self.im_start_token_id, self.im_end_token_id))

    @property
    def assistant_turn_suffix_ids(self) -> list[int]:
        """The template's end of an assistant turn (``<|im_end|>`` then a newline for ChatML)."""
        try:
            return self.encode(self.template_profile.assistant_end)
        except ChatTemplateError:
            return [self.im_end_token_id, *self.encode("\n")]

    def glue_after_assistant(self, response_ids: Sequence[int]) -> list[int]:
        """Ids the template puts after ``response_ids`` that the engine did not generate.

        A reply that stopped on ``<|im_end|>`` lacks only the newline; one cut by length also
        lacks the ``<|im_end|>``. TITO appends these before the next turn's delta.
        """
        suffix = self.assistant_turn_suffix_ids
        n = len(response_ids)
        # The longest tail of the response that is a head of the suffix is already in place.
        for k in range(min(n, len(suffix)), 0, -1):
            if list(response_ids[n - k:]) == suffix[:k]:
                return suffix[k:]
        return suffix

    def render_delta(self, base_messages: Sequence[Message], new_messages: Sequence[Message],
                     tools: Sequence[ToolSpec] | None = None,
                     add_generation_prompt: bool = True) -> list[int]:
        """Ids the template adds for ``new_messages`` after ``base_messages``.

        Equal to ``apply_chat_template(base + new)`` without the prefix that
        ``apply_chat_template(base, add_generation_prompt=False)`` produces. Raises
        :class:`~dressage.errors.ChatTemplateError` when that prefix is not an exact head of the
        full render (templates that rewrite earlier turns): the caller must then fall back to a
        full render and start a new lineage.
        """
        full = self.apply_chat_template([*base_messages, *new_messages], tools, add_generation_prompt)
        base = self.apply_chat_template(list(base_messages), tools, False) if base_messages else []
        if full[:len(base)] != base:
            at = next((i for i, (a, b) in enumerate(zip(full, base)) if a != b), min(len(full), len(base)))
            raise ChatTemplateError(
                f"render of the base messages ({len(base)} ids) is not a prefix of the full render "
                f"({len(full)} ids); first difference at id {at}: the template rewrites earlier turns"
            )
        return full[len(base):]
