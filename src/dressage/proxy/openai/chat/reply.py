"""A reply as OpenAI shows it: text cut at a stop sequence, and logprobs in OpenAI's shape.

Stop sequences act on the text only. The engine stops at the token that completes a stop
sequence and keeps that token (SGLang's ``/generate`` returns every generated id; its
``no_stop_trim`` only decides whether the *text* keeps the sequence), so the recorded tokens are
exactly the engine's, the stop sequence's tokens included, and nothing after that token exists.
The reply text ends before the first stop sequence, as OpenAI's does.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["cut_at_stop", "visible_prefix", "openai_logprobs"]


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to its first stop sequence, and whether one was found."""
    at = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text, False) if at < 0 else (text[:at], True)


def visible_prefix(text: str, stops: Sequence[str]) -> str:
    """What a stream may show of a growing reply: cut at a stop sequence, and without a tail that
    may still become the start of one."""
    if not stops:
        return text
    cut, found = cut_at_stop(text, stops)
    if found:
        return cut
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return text[:len(text) - hold] if hold else text


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": float(logprob), "bytes": list(token.encode("utf-8", "surrogatepass"))}


def openai_logprobs(ids: np.ndarray, logprobs: np.ndarray | None, top: Sequence[Any] | None,
                    token_text: Callable[[int], str], top_n: int) -> dict[str, Any]:
    """``choices[].logprobs``: one entry per generated token (the end-of-turn token included: the
    same tokens and logprobs the step records), each with up to ``top_n`` alternatives.

    ``top`` is SGLang's ``output_top_logprobs`` (per token, ``[logprob, id, text]`` triples).
    """
    content = []
    lps = np.zeros(len(ids), np.float32) if logprobs is None else logprobs
    for i, (t, lp) in enumerate(zip(ids.tolist(), lps.tolist())):
        entry = _entry(token_text(t), lp)
        alts = []
        if top_n and top is not None and i < len(top):
            for alt in (top[i] or [])[:top_n]:
                alts.append(_entry(token_text(int(alt[1])), alt[0]))
        entry["top_logprobs"] = alts
        content.append(entry)
    return {"content": content, "refusal": None}
