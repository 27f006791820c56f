"""Proxy layer: the online side between agents and the inference engine.

``Proxy.start(ProxyConfig)`` (:mod:`dressage.proxy.deployment`) assembles one; the service
(:mod:`dressage.proxy.service`) holds every use case and the HTTP module (:mod:`dressage.proxy.http.app`)
only routes to it. See docs/architecture.md.
"""

from __future__ import annotations

from dressage._lazy import lazy_exports

_EXPORTS = {"Proxy": "dressage.proxy.deployment", "build_service": "dressage.proxy.deployment",
            "ProxyConfig": "dressage.proxy.config", "ServerConfig": "dressage.proxy.config",
            "AccessConfig": "dressage.proxy.config", "EnginesConfig": "dressage.proxy.config",
            "LimitsConfig": "dressage.proxy.config", "SessionsConfig": "dressage.proxy.config",
            "ReadsConfig": "dressage.proxy.config", "JournalConfig": "dressage.proxy.config", "ProxyService": "dressage.proxy.service",
            "ProxyServer": "dressage.proxy.http.app", "ProxyCore": "dressage.proxy.recording.core"}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
