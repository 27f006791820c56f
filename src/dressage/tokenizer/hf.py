"""A Hugging Face tokenizer behind the ``Tokenizer`` interface (``--tokenizer PATH``).

``transformers`` is optional and imported only when a tokenizer is loaded from a path; an
already-built tokenizer object (anything with HF's ``encode`` / ``decode`` /
``apply_chat_template``) can be wrapped directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Sequence

from dressage.errors import ChatTemplateError, TokenizerError
from dressage.tokenizer.base import Message, Tokenizer, ToolSpec
from dressage.tokenizer.chatml import ENDOFTEXT, IM_END, IM_START, message_text

__all__ = ["HFTokenizer"]

def _template_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages as Jinja templates expect them: ``content`` always a string.

    OpenAI leaves ``content`` out (or null) on an assistant turn that only calls tools, and may
    send a list of text parts; templates such as Qwen3's read ``message.content`` as a string.
    """
    out = []
    for i, m in enumerate(messages):
        d = dict(m)
        d["content"] = message_text(m, i)
        out.append(d)
    return out


class HFTokenizer(Tokenizer):
    """Wraps a ``transformers`` tokenizer; special ids come from its vocabulary."""

    name = "hf"

    def __init__(self, hf_tokenizer: Any, *, name: str | None = None) -> None:
        self._tok = hf_tokenizer
        self.name = name or str(getattr(hf_tokenizer, "name_or_path", "") or "hf")

    @classmethod
    def from_pretrained(cls, path: str, **kwargs: Any) -> "HFTokenizer":
        """Load with ``transformers.AutoTokenizer.from_pretrained(path)``."""
        try:
            from transformers import AutoTokenizer  # optional dependency
        except ImportError as exc:
            raise TokenizerError(
                f"tokenizer {path!r} needs the 'transformers' package (pip install transformers); "
                "or use the built-in byte tokenizer (--tokenizer byte)"
            ) from exc
        # A local folder is read as it is: never a hub look-up at run time.
        import os
        if os.path.isdir(path):
            kwargs.setdefault("local_files_only", True)
        try:
            tok = AutoTokenizer.from_pretrained(path, **kwargs)
        except (OSError, ValueError) as exc:
            raise TokenizerError(f"cannot load tokenizer from {path!r}: {exc}") from exc
        return cls(tok, name=path)

    @property
    def hf_tokenizer(self) -> Any:
        return self._tok

    def _token_id(self, token: str) -> int | None:
        tid = self._tok.convert_tokens_to_ids(token)
        unk = getattr(self._tok, "unk_token_id", None)
        if tid is None or isinstance(tid, list) or (unk is not None and tid == unk and token != self._tok.unk_token):
            return None
        return int(tid)

    # docstring inherited
    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    # docstring inherited
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(t) for t in ids], skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    @property
    def eos_token_id(self) -> int:
        tid = getattr(self._tok, "eos_token_id", None)
        if tid is None:
            tid = self._token_id(ENDOFTEXT)
        if tid is None:
            raise TokenizerError(f"tokenizer {self.name!r} has no eos token")
        return int(tid)

    @property
    def im_start_token_id(self) -> int:
        tid = self._token_id(IM_START)
        if tid is None:
            tid = getattr(self._tok, "bos_token_id", None)
        if tid is None:
            raise TokenizerError(f"tokenizer {self.name!r} has neither {IM_START} nor a bos token")
        return int(tid)

    @property
    def im_end_token_id(self) -> int:
        # Non-ChatML models end a turn with their eos token.
        tid = self._token_id(IM_END)
        return self.eos_token_id if tid is None else tid

    # docstring inherited
    def apply_chat_template(self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None = None,
                            add_generation_prompt: bool = True) -> list[int]:
        try:
            out = self._tok.apply_chat_template(
                _template_messages(messages), tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt, tokenize=True,
            )
        except Exception as exc:  # jinja2 raises its own types; report them as ours
            raise ChatTemplateError(f"chat template of {self.name!r} failed: {exc}") from exc
        if isinstance(out, Mapping):  # newer transformers return a BatchEncoding
            out = out["input_ids"]
        return [int(t) for t in out]

    # docstring inherited
    def render_text(self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None = None,
                    add_generation_prompt: bool = True) -> str:
        try:
            out = self._tok.apply_chat_template(
                _template_messages(messages), tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt, tokenize=False,
            )
        except Exception as exc:  # jinja2 raises its own types; report them as ours
            raise ChatTemplateError(f"chat template of {self.name!r} failed: {exc}") from exc
        if not isinstance(out, str):
            raise ChatTemplateError(f"chat template of {self.name!r} renders token ids only")
        return out

    @property
    def template_source(self) -> str | None:
        source = getattr(self._tok, "chat_template", None)
        return source if isinstance(source, str) else None
