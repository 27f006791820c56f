"""``python -m dressage.proxy.server``: upstream Dressage's Proxy command line, starting this Proxy.

Upstream's launch scripts run this module with upstream's flags and ``DRESSAGE_*`` environment. Every
flag is a flat name of a :class:`~dressage.proxy.config.ProxyConfig` setting (``dressage proxy serve``
takes the same ones); only upstream's defaults differ: port 8800, every interface, ``--api-key no-auth``,
SSE heartbeats every 15 s, and the SGLang router that ``SGLANG_ROUTER_URL`` / ``SGLANG_ROUTER_HOST`` / ``SGLANG_ROUTER_PORT`` /
``MASTER_ADDR`` name when no engine is given.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Sequence

from dressage.flags import ConfigTree
from dressage.proxy.config import NO_AUTH, ProxyConfig, environment_overrides

__all__ = ["UPSTREAM_DEFAULTS", "upstream_config", "main"]

UPSTREAM_DEFAULTS = {"server.port": 8800, "server.host": "0.0.0.0", "access.api_token": NO_AUTH,
                     "server.stream_heartbeat_interval_s": 15.0}
"""Upstream's Proxy defaults where they differ from ``dressage proxy serve``'s."""
_ROUTER_PORT = 8000  # upstream's default SGLang router port


def _tree() -> ConfigTree:
    return ConfigTree(ProxyConfig, defaults=UPSTREAM_DEFAULTS)


def _router_from_environment(environ: Mapping[str, str]) -> str:
    if environ.get("SGLANG_ROUTER_URL"):
        return environ["SGLANG_ROUTER_URL"]
    host = environ.get("SGLANG_ROUTER_HOST") or environ.get("MASTER_ADDR") or "127.0.0.1"
    return f"http://{host}:{environ.get('SGLANG_ROUTER_PORT') or _ROUTER_PORT}"


def upstream_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> ProxyConfig:
    """The validated config of upstream's command line ``argv`` and environment ``environ``
    (default: this process's); a bad flag or value exits with argparse's usage error naming it."""
    import argparse

    from dressage.errors import ConfigError

    environ = os.environ if environ is None else environ
    tree = _tree()
    parser = argparse.ArgumentParser(prog="python -m dressage.proxy.server",
                                     description="Dressage Proxy (upstream Dressage's command line)")
    tree.add_to(parser)
    values = tree.values(parser.parse_args(argv))
    engines = values.get("engines", {})
    extra: dict[str, Any] = environment_overrides(environ, values)
    if not engines.get("engine_urls") and not engines.get("router_url") and not engines.get("engine_url"):
        extra["engines.router_url"] = _router_from_environment(environ)
    try:
        return tree.build(values, **extra)
    except ConfigError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def main(argv: Sequence[str] | None = None) -> int:
    from dressage.proxy.deployment import Proxy

    cfg = upstream_config(argv)
    with Proxy.start(cfg) as proxy:
        print(f"dressage proxy: serving on {proxy.url} -> {', '.join(cfg.engines.urls)}", flush=True)
        proxy.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
