"""``dressage proxy serve``: the OpenAI-compatible Proxy in front of an SGLang engine.

Every flag is generated from the :class:`dressage.proxy.config.ProxyConfig` tree (defaults and help
declared once there); the command builds that config and calls ``Proxy.start``.
"""

from __future__ import annotations

import argparse
import os

def _tree():
    from dressage.flags import ConfigTree
    from dressage.proxy.config import ProxyConfig

    return ConfigTree(ProxyConfig, defaults={"server.port": 8000})


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("proxy", help="the agent-facing Proxy (OpenAI API in, SGLang /generate out)")
    psub = p.add_subparsers(dest="proxy_command", metavar="ACTION")
    psub.required = True
    from dressage.cli.journal import register as register_journal
    register_journal(psub)
    s = psub.add_parser("serve", help="serve the Proxy over HTTP",
                        description="Every setting has a dotted name (--server.port) and its flat name (--port); "
                                    "--config FILE sets the whole tree from YAML.")
    _tree().add_to(s)
    s.set_defaults(func=_serve)


def proxy_config(args: argparse.Namespace):
    """The validated :class:`ProxyConfig` of ``dressage proxy serve``'s flags (and ``--config`` file)."""
    from dressage.errors import ConfigError
    from dressage.proxy.config import environment_overrides

    tree = _tree()
    values = tree.values(args)
    engines = values.get("engines", {})
    if not engines.get("engine_urls") and not engines.get("router_url") and not engines.get("engine_url"):
        raise ConfigError("proxy serve: give the engine with --engine-url URL (or a router with --sglang-router-url URL)")
    # Tokens (and upstream's DRESSAGE_* settings) may come from the environment; flags win.
    return tree.build(values, **environment_overrides(os.environ, values))


def _serve(args: argparse.Namespace) -> int:
    from dressage.proxy.deployment import Proxy
    from dressage.serving import tune_gc_for_serving

    cfg = proxy_config(args)
    if cfg.server.log_format != "text":
        from dressage.observe.logs import configure_logging

        configure_logging(cfg.server.log_format, process="proxy")
    with Proxy.start(cfg) as proxy:
        report = proxy.recovery
        if report is not None and (report.records or report.damage is not None):
            print(f"dressage proxy: journal {cfg.journal.path}: {len(report.active)} sessions resumed, "
                  f"{len(report.finalized)} finalized, {len(report.aborted)} aborted"
                  + (" (a torn last record was dropped)" if report.truncated_tail else ""), flush=True)
            if report.mid_journal_damage:
                print(f"dressage proxy: journal damaged, started on its intact prefix (--journal-recover "
                      f"truncate): {report.damage_text()}; set aside in {report.set_aside}", flush=True)
            if report.tq_check_error is not None:
                print(f"dressage proxy: could not check the journal's TQ keys: {report.tq_check_error}", flush=True)
            if report.lost_fields:
                print(f"dressage proxy: {len(report.lost_fields)} sessions (finalized or active) name TQ keys the "
                      f"TransferQueue no longer holds: their large fields are lost; reads mark them "
                      f"(metadata.large_fields_lost): {', '.join(list(report.lost_fields)[:5])}"
                      + (" ..." if len(report.lost_fields) > 5 else ""), flush=True)
            if report.ended_steps:
                print(f"dressage proxy: journal: {report.ended_steps_text()}", flush=True)
        dp = proxy.config.data_plane
        if proxy.engine_check is not None:
            print(f"dressage proxy: engine check passed: {proxy.engine_check.describe()}", flush=True)
        print(f"dressage proxy: serving on {proxy.url} -> {'router' if cfg.engines.router else 'engine(s)'} "
              f"{', '.join(cfg.engines.urls)} "
              f"(R3 {'on' if dp.use_rollout_routing_replay else 'off'}, TQ "
              f"{'on: ' + ','.join(dp.offloaded) if dp.enable_transfer_queue else 'off'})", flush=True)
        if proxy.spec_file is not None:
            print(f"dressage proxy: TransferQueue client spec in {proxy.spec_file} (training ranks may also ask "
                  f"GET {proxy.url}/transfer_queue/spec)", flush=True)
        # start-up's objects frozen, the young generation swept into the frozen one (and everything
        # collected once drained), pauses counted
        sweeper = tune_gc_for_serving(idle=proxy.service.in_flight.idle)
        try:
            proxy.wait()
        finally:
            sweeper.stop()
    return 0
