"""The floor of a Ray actor process: an actor whose class and calls import nothing of ours.

Its PSS, sampled beside the components (outside the metric), is what any Ray actor process costs here
before it runs any code of ours (the Ray worker runtime and what it loads itself). The class is made
with ``__module__ = "__main__"`` so Ray ships it by value and the worker imports no module of this
package to build it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["floor_actor", "floor_pid"]


def floor_actor(**options: Any) -> Any:
    """Start the bare actor (``options`` as for ``.options()``, e.g. its node's resource)."""
    import ray

    cls = type("FloorActor", (), {"__module__": "__main__", "__doc__": "A Ray actor with no code of ours."})
    return ray.remote(num_cpus=0)(cls).options(**options).remote()


def floor_pid(actor: Any, timeout_s: float = 120.0) -> int:
    import ray

    return int(ray.get(actor.__ray_call__.remote(lambda self: __import__("os").getpid()), timeout=timeout_s))
