"""Engine calls made before the Proxy's event loop runs (start-up checks, the first worker list).

Each runs on an event loop of its own in a thread of its own, so it works whether or not the caller's
thread already runs a loop, and no connection of the Proxy's own pools is bound to that loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, TypeVar

__all__ = ["run_on_private_loop"]

T = TypeVar("T")


def run_on_private_loop(call: Callable[[], Awaitable[T]], *, name: str) -> T:
    """``await call()`` on a private loop in thread ``name``; its exception is raised here."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = asyncio.run(call())
        except BaseException as exc:  # re-raised in the caller's thread
            result["error"] = exc

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
