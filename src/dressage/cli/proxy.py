"""``dressage proxy serve``: the OpenAI-compatible Proxy in front of an SGLang engine.

Every flag is generated from a field of :class:`dressage.proxy.config.ProxyConfig` (defaults and
help declared once there); the command builds that config and calls ``Proxy.start``.
"""

from __future__ import annotations

import argparse
import os

from dressage.cli._dataplane import add_data_plane_args, data_plane_config


def register(sub: argparse._SubParsersAction) -> None:
    from dressage.flags import add_flags
    from dressage.proxy.config import JournalConfig, ProxyConfig, ProxyServerConfig

    p = sub.add_parser("proxy", help="the agent-facing Proxy (OpenAI API in, SGLang /generate out)")
    psub = p.add_subparsers(dest="proxy_command", metavar="ACTION")
    psub.required = True
    from dressage.cli.journal import register as register_journal
    register_journal(psub)
    s = psub.add_parser("serve", help="serve the Proxy over HTTP")
    add_flags(s, ProxyServerConfig, defaults={"port": 8000})
    add_flags(s, JournalConfig, prefix="journal_")
    add_flags(s, ProxyConfig)
    add_data_plane_args(s)
    s.set_defaults(func=_serve)


def server_config(args: argparse.Namespace):
    """The validated :class:`ProxyServerConfig` of ``dressage proxy serve``'s flags."""
    from dressage.errors import ConfigError
    from dressage.flags import from_flags
    from dressage.proxy.config import ProxyServerConfig

    from dressage.proxy.config import ADMIN_TOKEN_ENV, AGENT_TOKEN_ENV

    if not args.engine_urls and not args.router_url:
        raise ConfigError("proxy serve: give the engine with --engine-url URL (or a router with --sglang-router-url URL)")
    # Tokens come from a flag, a file or the environment (arguments show in `ps`; the others do not).
    extra = {}
    for key, env in (("api_token", AGENT_TOKEN_ENV), ("admin_token", ADMIN_TOKEN_ENV)):
        if getattr(args, key, None) is None and getattr(args, key + "_file", None) is None and os.environ.get(env):
            extra[key] = os.environ[env]
    return from_flags(ProxyServerConfig, args, **extra)


def proxy_config(args: argparse.Namespace):
    """The validated :class:`ProxyConfig` of ``dressage proxy serve``'s flags."""
    from dressage.flags import from_flags
    from dressage.proxy.config import JournalConfig, ProxyConfig

    return from_flags(ProxyConfig, args, data_plane=data_plane_config(args), server=server_config(args),
                      journal=from_flags(JournalConfig, args, prefix="journal_"))


def _serve(args: argparse.Namespace) -> int:
    from dressage.proxy.deployment import Proxy
    from dressage.serving import tune_gc_for_serving

    cfg = proxy_config(args)
    with Proxy.start(cfg) as proxy:
        report = proxy.recovery
        if report is not None and report.records:
            print(f"dressage proxy: journal {cfg.journal.path}: {len(report.active)} sessions resumed, "
                  f"{len(report.finalized)} finalized, {len(report.aborted)} aborted"
                  + (" (a torn last record was dropped)" if report.truncated_tail else ""), flush=True)
        dp = proxy.config.data_plane
        if proxy.engine_check is not None:
            print(f"dressage proxy: engine check passed: {proxy.engine_check.describe()}", flush=True)
        print(f"dressage proxy: serving on {proxy.url} -> {'router' if cfg.server.router else 'engine(s)'} "
              f"{', '.join(cfg.server.engines)} "
              f"(R3 {'on' if dp.use_rollout_routing_replay else 'off'}, TQ "
              f"{'on: ' + ','.join(dp.offloaded) if dp.enable_transfer_queue else 'off'})", flush=True)
        tune_gc_for_serving()  # start-up's objects frozen, the young generation collected less often
        proxy.wait()
    return 0
