"""Which node a client writes from: placement puts a writer's keys on its own node's StorageUnit first."""

from __future__ import annotations

import sys

__all__ = ["current_node_id"]


def current_node_id() -> str | None:
    """This process's Ray node id, or None outside Ray.

    A process Ray started (a worker, or a driver after ``ray.init``) has imported ``ray`` already;
    any other process is outside Ray, and importing it only to learn that would cost a plain process
    (a Proxy run as its own service) tens of MiB of modules.
    """
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()
