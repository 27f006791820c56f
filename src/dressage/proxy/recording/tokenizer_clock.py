"""``TimedTokenizer``: the Proxy's tokenizer with the CPU time its calls take, summed.

Every method call (``encode``, ``decode``, ``apply_chat_template``, the TITO helpers, ...) is
timed with :func:`time.thread_time` on the thread that makes it, so the sum is CPU time spent
tokenizing, not wall time spent waiting; a call the tokenizer makes on itself is counted once, in
its caller. Properties and plain attributes pass through untimed. ``GET /trajectory/stats`` reports
the sum as ``tokenizer_cpu_s``, so the Proxy's own cost can be told apart from tokenization.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

__all__ = ["TimedTokenizer"]


class TimedTokenizer:
    """Wraps ``inner``; ``cpu_s`` and ``calls`` are the totals since it was made."""

    __slots__ = ("_inner", "_lock", "_methods", "cpu_s", "calls")

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._methods: dict[str, Callable[..., Any]] = {}
        self.cpu_s = 0.0
        self.calls = 0

    @property
    def inner(self) -> Any:
        return self._inner

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock, lock = time.thread_time, self._lock

        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = clock() - t0
                with lock:
                    self.cpu_s += spent
                    self.calls += 1

        call.__name__ = call.__qualname__ = name
        call.__doc__ = fn.__doc__
        return call

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not on the wrapper itself: the inner tokenizer's attributes.
        methods = self._methods
        if name in methods:
            return methods[name]
        value = getattr(self._inner, name)
        if callable(value) and not name.startswith("__") and not isinstance(value, type):
            value = methods[name] = self._timed(name, value)
        return value

    def __repr__(self) -> str:
        return f"TimedTokenizer({self._inner!r})"
