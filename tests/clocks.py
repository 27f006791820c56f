"""Time in tests: a clock the test sets (for components that take a ``clock``) and a bounded wait for
something a background thread does."""

from __future__ import annotations

import time
from typing import Callable


class FakeClock:
    """A clock that stands still until the test sets ``now``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def eventually(check: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Return once ``check()`` is true; AssertionError when ``timeout_s`` passed first."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout_s} s")
        time.sleep(0.01)
