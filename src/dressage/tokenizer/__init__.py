"""Tokenizers: the ``Tokenizer`` interface, the built-in byte tokenizer and a Hugging Face wrapper.

``load_tokenizer("byte")`` gives the built-in one; ``qwen3``, ``qwen3.5`` and ``qwen3.6`` give real
vocabularies from installed packages (:mod:`dressage.tokenizer.packaged`); any other value is a
Hugging Face tokenizer: a local folder (read as it is, never a hub look-up) or a hub id, which
``transformers`` fetches (or finds in its cache).
"""

from dressage.tokenizer.base import Message, Tokenizer, ToolSpec
from dressage.tokenizer.byte import ByteTokenizer
from dressage.tokenizer.chatml import render_chatml
from dressage.tokenizer.hf import HFTokenizer
from dressage.tokenizer.template import VERIFIED_TEMPLATES, TemplateProfile
from dressage.tokenizer.tito import Continuation, continuation

__all__ = ["Tokenizer", "Message", "ToolSpec", "ByteTokenizer", "HFTokenizer", "render_chatml", "load_tokenizer",
           "TemplateProfile", "VERIFIED_TEMPLATES", "Continuation", "continuation"]


def load_tokenizer(spec: "str | Tokenizer" = "byte") -> Tokenizer:
    """A tokenizer from a ``--tokenizer`` value: ``byte`` (built in) or a Hugging Face path."""
    if isinstance(spec, Tokenizer):
        return spec
    if spec in ("", "byte"):
        return ByteTokenizer()
    if spec == "qwen3":
        from dressage.tokenizer.packaged import qwen3_tokenizer_dir
        tok = HFTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
        tok.name = "qwen3"
        return tok
    if spec.startswith(("qwen3.5", "qwen3.6")):
        from dressage.tokenizer.qwen35 import Qwen35Tokenizer
        return Qwen35Tokenizer("qwen3.6-35b-a3b" if spec in ("qwen3.5", "qwen3.6") else spec)
    return HFTokenizer.from_pretrained(spec)
