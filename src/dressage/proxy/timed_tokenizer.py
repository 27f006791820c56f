"""The Proxy's tokenizer with its CPU time counted: tokenization is reported apart from the Proxy's own cost.

:class:`TimedTokenizer` forwards everything to the tokenizer it wraps; the calls that tokenize or
detokenize (``apply_chat_template``, ``continuation``, ``encode``, ``decode``) add the CPU time of
the calling thread (``time.thread_time``) to :attr:`cpu_s`, which ``/trajectory/stats`` reports as
``tokenizer_cpu_s``.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["TimedTokenizer", "TIMED_METHODS"]

TIMED_METHODS = frozenset({"apply_chat_template", "continuation", "encode", "decode"})


class TimedTokenizer:
    """``tokenizer`` with the CPU seconds of its tokenizing calls summed in :attr:`cpu_s`."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.cpu_s = 0.0
        self.calls = 0

    @property
    def wrapped(self) -> Any:
        return self._tokenizer

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._tokenizer, name)
        if name not in TIMED_METHODS or not callable(value):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return value(*args, **kwargs)
            finally:
                self.cpu_s += time.thread_time() - t0
                self.calls += 1

        return timed
