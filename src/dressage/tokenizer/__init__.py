"""Tokenizers: the ``Tokenizer`` interface, the built-in byte tokenizer and a Hugging Face wrapper.

``load_tokenizer("byte")`` gives the built-in one; any other value is a Hugging Face path or name.
"""

from dressage.tokenizer.base import Message, Tokenizer, ToolSpec
from dressage.tokenizer.byte import ByteTokenizer
from dressage.tokenizer.chatml import render_chatml
from dressage.tokenizer.hf import HFTokenizer

__all__ = ["Tokenizer", "Message", "ToolSpec", "ByteTokenizer", "HFTokenizer", "render_chatml", "load_tokenizer"]


def load_tokenizer(spec: "str | Tokenizer" = "byte") -> Tokenizer:
    """A tokenizer from a ``--tokenizer`` value: ``byte`` (built in) or a Hugging Face path."""
    if isinstance(spec, Tokenizer):
        return spec
    if spec in ("", "byte"):
        return ByteTokenizer()
    return HFTokenizer.from_pretrained(spec)
