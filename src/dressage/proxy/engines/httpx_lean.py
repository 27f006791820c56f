"""``httpx`` imported without its command-line client.

``import httpx`` also imports ``httpx._main`` (the ``httpx`` console command) whenever its extras are
installed, and with it rich, click and pygments: about 5.7 MiB in every Proxy process, for a command
the Proxy never runs. Importing through this module skips that one submodule (``httpx`` falls back to
its stub ``main``) and then forgets the block, so ``httpx._main`` can still be imported explicitly.
An ``httpx`` that is already imported is used as it is.
"""

from __future__ import annotations

import sys

if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # type: ignore[assignment] - a None entry fails the import
    try:
        import httpx
    finally:
        if sys.modules.get("httpx._main", 0) is None:
            del sys.modules["httpx._main"]
else:
    import httpx

__all__ = ["httpx"]
