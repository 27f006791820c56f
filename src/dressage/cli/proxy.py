"""``dressage proxy serve``: the OpenAI-compatible Proxy in front of an SGLang engine."""

from __future__ import annotations

import argparse
import os

from dressage.cli._dataplane import add_data_plane_args, data_plane_config, transfer_queue_config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("proxy", help="the agent-facing Proxy (OpenAI API in, SGLang /generate out)")
    psub = p.add_subparsers(dest="proxy_command", metavar="ACTION")
    psub.required = True
    from dressage.cli.journal import register as register_journal
    register_journal(psub)
    s = psub.add_parser("serve", help="serve the Proxy over HTTP")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--engine-url", required=True, action="append", dest="engine_urls", metavar="URL",
                   help="SGLang base URL, e.g. http://127.0.0.1:30000; repeat for several engines "
                        "(sessions stick to one by consistent hashing)")
    s.add_argument("--api-token", default=os.environ.get("DRESSAGE_PROXY_TOKEN"),
                   help="require 'Authorization: Bearer TOKEN' (default: $DRESSAGE_PROXY_TOKEN, none if unset)")
    s.add_argument("--tokenizer", default="byte", help="'byte' (built in) or a Hugging Face tokenizer path")
    s.add_argument("--request-timeout", type=float, default=600.0, help="seconds per engine call")
    s.add_argument("--served-model-name", default="dressage-policy", help="model name in OpenAI answers")
    s.add_argument("--default-max-tokens", type=int, default=1024, metavar="N",
                   help="new tokens of a call that gives no max_tokens")
    s.add_argument("--context-window", type=int, default=None, metavar="N",
                   help="prompt + reply tokens per call: clamps max new tokens; a longer prompt gets context_overflow")
    s.add_argument("--max-output-tokens", type=int, default=None, metavar="N", help="cap on any call's new tokens")
    s.add_argument("--max-steps-per-session", type=int, default=None, metavar="N",
                   help="model calls one session may record")
    s.add_argument("--partial-rollout", action="store_true",
                   help="resume generations cut by /v1/rollout/pause under the new weights (per-token versions); "
                        "off: a trajectory whose weight version changes is rejected")
    s.add_argument("--health-check-interval", type=float, default=5.0, metavar="S",
                   help="seconds between engine health checks with several engines (0: none)")
    s.add_argument("--health-check-failures", type=int, default=1, metavar="N",
                   help="failed checks in a row that take an engine out (its sessions move)")
    s.add_argument("--journal", metavar="PATH", default=None,
                   help="append every committed step to this journal and replay it on start: a restarted "
                        "Proxy resumes its sessions")
    s.add_argument("--journal-fsync", choices=("always", "interval", "never"), default="always",
                   help="when journal appends reach the disk (default: always, before the reply)")
    add_data_plane_args(s)
    s.set_defaults(func=_serve)


def server_config(args: argparse.Namespace):
    """The validated :class:`ProxyServerConfig` of ``dressage proxy serve``'s flags."""
    from dressage.proxy.server_config import ProxyServerConfig

    return ProxyServerConfig(
        host=args.host, port=args.port, engine_urls=tuple(args.engine_urls), api_token=args.api_token,
        request_timeout_s=args.request_timeout, served_model_name=args.served_model_name,
        default_max_tokens=args.default_max_tokens, context_window=args.context_window,
        max_output_tokens=args.max_output_tokens, max_steps_per_session=args.max_steps_per_session,
        partial_rollout=args.partial_rollout, health_check_interval_s=args.health_check_interval,
        health_check_failures=args.health_check_failures)


def _serve(args: argparse.Namespace) -> int:
    from dressage.proxy.core import ProxyCore
    from dressage.proxy.server import ProxyServer, ProxyService
    from dressage.tokenizer import load_tokenizer

    dp = data_plane_config(args)
    server_cfg = server_config(args)
    tq_cfg = transfer_queue_config(args)
    tok = load_tokenizer(args.tokenizer)
    tq = None
    if tq_cfg is not None:
        from dressage.tq import TransferQueue

        tq = TransferQueue.start(tq_cfg)
    try:
        core = ProxyCore(dp, tq.client() if tq else None, decode=tok.decode, special_ids=tok.special_token_ids)
        service = ProxyService(server_cfg, core, tok)
        if args.journal:
            from dressage.proxy.journal import Journal

            report = core.recover(args.journal)
            for done in report.delivered:
                service.finalized[done.session_id] = done
            if report.records:
                print(f"dressage proxy: journal {args.journal}: {len(report.active)} sessions resumed, "
                      f"{len(report.finalized)} finalized, {len(report.aborted)} aborted"
                      + (" (a torn last record was dropped)" if report.truncated_tail else ""), flush=True)
            core.journal = Journal(args.journal, fsync=args.journal_fsync)
        print(f"dressage proxy: serving on http://{args.host}:{args.port} -> "
              f"engine(s) {', '.join(server_cfg.engines)} "
              f"(R3 {'on' if dp.use_rollout_routing_replay else 'off'}, TQ "
              f"{'on: ' + ','.join(dp.offloaded) if dp.enable_transfer_queue else 'off'})", flush=True)
        ProxyServer(service).serve()
    finally:
        if tq is not None:
            tq.shutdown()
    return 0
