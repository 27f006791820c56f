"""The built-in byte-level tokenizer: ids 0..255 are UTF-8 bytes, three control tokens above.

Needs no files or downloads, round-trips any text exactly, and carries the ChatML template, so
the local engine and the Proxy agree on token ids without a model checkout.
"""

from __future__ import annotations

import re
from typing import Sequence

from dressage.tokenizer.chatml import ENDOFTEXT, IM_END, IM_START, ChatMLTokenizer

__all__ = ["ByteTokenizer"]

_SPECIALS = (ENDOFTEXT, IM_START, IM_END)
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in _SPECIALS) + ")")


class ByteTokenizer(ChatMLTokenizer):
    """Bytes as tokens; ``<|endoftext|>`` = 256, ``<|im_start|>`` = 257, ``<|im_end|>`` = 258."""

    name = "byte"
    profile_name = "chatml"
    _BASE = 256

    def __init__(self) -> None:
        self._specials = {s: self._BASE + i for i, s in enumerate(_SPECIALS)}
        self._id_to_special = {v: k for k, v in self._specials.items()}

    # docstring inherited
    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        ids: list[int] = []
        for piece in _SPECIAL_RE.split(text):
            if not piece:
                continue
            special = self._specials.get(piece)
            if special is not None:
                ids.append(special)
            else:
                ids.extend(piece.encode("utf-8"))
        return ids

    # docstring inherited
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        out: list[str] = []
        run = bytearray()
        for t in ids:
            t = int(t)
            if 0 <= t < self._BASE:
                run.append(t)
                continue
            # Flush the byte run first so a multi-byte character split by nothing decodes whole.
            if run:
                out.append(run.decode("utf-8", errors="replace"))
                run.clear()
            special = self._id_to_special.get(t)
            if special is None:
                raise ValueError(f"token id {t} is outside the byte tokenizer's vocabulary (0..{self.vocab_size - 1})")
            if not skip_special_tokens:
                out.append(special)
        if run:
            out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    @property
    def vocab_size(self) -> int:
        return self._BASE + len(_SPECIALS)
