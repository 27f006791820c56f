"""Proxy layer: the online side between agents and the inference engine.

``Proxy.start(ProxyConfig)`` (:mod:`dressage.proxy.deployment`) assembles one; the service
(:mod:`dressage.proxy.service`) holds every use case and the HTTP module (:mod:`dressage.proxy.http`)
only routes to it. See docs/architecture.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"Proxy": "dressage.proxy.deployment", "build_service": "dressage.proxy.deployment",
            "ProxyConfig": "dressage.proxy.config", "ProxyServerConfig": "dressage.proxy.config",
            "JournalConfig": "dressage.proxy.config", "ProxyService": "dressage.proxy.service",
            "ProxyServer": "dressage.proxy.http", "ProxyCore": "dressage.proxy.core"}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dressage.proxy' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
