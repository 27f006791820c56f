"""``dressage proxy serve``: the OpenAI-compatible Proxy in front of an SGLang engine."""

from __future__ import annotations

import argparse
import os

from dressage.cli._dataplane import add_data_plane_args, data_plane_config, transfer_queue_config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("proxy", help="the agent-facing Proxy (OpenAI API in, SGLang /generate out)")
    psub = p.add_subparsers(dest="proxy_command", metavar="ACTION")
    psub.required = True
    s = psub.add_parser("serve", help="serve the Proxy over HTTP")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--engine-url", required=True, help="SGLang base URL, e.g. http://127.0.0.1:30000")
    s.add_argument("--api-token", default=os.environ.get("DRESSAGE_PROXY_TOKEN"),
                   help="require 'Authorization: Bearer TOKEN' (default: $DRESSAGE_PROXY_TOKEN, none if unset)")
    s.add_argument("--tokenizer", default="byte", help="'byte' (built in) or a Hugging Face tokenizer path")
    s.add_argument("--request-timeout", type=float, default=600.0, help="seconds per engine call")
    add_data_plane_args(s)
    s.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from dressage.proxy.core import ProxyCore
    from dressage.proxy.server import ProxyServer, ProxyServerConfig, ProxyService
    from dressage.proxy.sglang_client import SGLangClient
    from dressage.tokenizer import load_tokenizer

    dp = data_plane_config(args)
    server_cfg = ProxyServerConfig(host=args.host, port=args.port, engine_url=args.engine_url,
                                   api_token=args.api_token, request_timeout_s=args.request_timeout)
    tq_cfg = transfer_queue_config(args)
    tok = load_tokenizer(args.tokenizer)
    tq = None
    if tq_cfg is not None:
        from dressage.tq import TransferQueue

        tq = TransferQueue.start(tq_cfg)
    try:
        core = ProxyCore(dp, tq.client() if tq else None, decode=tok.decode, special_ids=tok.special_token_ids)
        service = ProxyService(server_cfg, core, tok, SGLangClient(args.engine_url, timeout=args.request_timeout))
        print(f"dressage proxy: serving on http://{args.host}:{args.port} -> engine {args.engine_url} "
              f"(R3 {'on' if dp.use_rollout_routing_replay else 'off'}, TQ "
              f"{'on: ' + ','.join(dp.offloaded) if dp.enable_transfer_queue else 'off'})", flush=True)
        ProxyServer(service).serve()
    finally:
        if tq is not None:
            tq.shutdown()
    return 0
