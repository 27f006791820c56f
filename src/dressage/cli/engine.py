"""``dressage engine serve``: the SGLang-protocol engine for machines without GPUs.

Every flag is generated from the :class:`dressage.engine.config.EngineConfig` tree (defaults and help
declared once there).
"""

from __future__ import annotations

import argparse
import sys


def _tree():
    from dressage.engine.config import EngineConfig
    from dressage.flags import ConfigTree

    return ConfigTree(EngineConfig)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engine", help="inference engine that speaks SGLang's /generate protocol (no GPU)")
    esub = p.add_subparsers(dest="engine_command", metavar="ENGINE_COMMAND")
    esub.required = True
    s = esub.add_parser("serve", help="serve /generate, /abort_request, /health, /get_model_info, ...")
    _tree().add_to(s)
    s.set_defaults(func=_serve)


def config_from_args(args: argparse.Namespace):
    """The validated :class:`EngineConfig` of ``dressage engine serve``'s flags (and ``--config`` file)."""
    return _tree().build(args)


def _serve(args: argparse.Namespace) -> int:
    from dressage.engine.server import EngineServer
    from dressage.proxy.parsers import ParseEndpoints

    config = config_from_args(args)
    server = EngineServer(config, reply_parsers=ParseEndpoints())
    m = config.model

    def announce(url: str) -> None:  # the bound address: with --port 0, the port the system chose
        print(f"dressage engine ({config.backend}): {m.name} ({m.num_layers} layers x top-{m.topk} of "
              f"{m.num_experts} experts), tokenizer {config.tokenizer}, seed {config.seed}, on {url}",
              file=sys.stderr, flush=True)

    server.serve(on_bound=announce)
    return 0
