"""``dressage engine serve``: the SGLang-protocol engine for machines without GPUs."""

from __future__ import annotations

import argparse
import sys

from dressage.engine.config import DEFAULT_MODEL, EngineConfig, model_from_preset
from dressage.fields.models import MODEL_PRESETS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engine", help="inference engine that speaks SGLang's /generate protocol (no GPU)")
    esub = p.add_subparsers(dest="engine_command", metavar="ENGINE_COMMAND")
    esub.required = True
    s = esub.add_parser("serve", help="serve /generate, /abort_request, /health, /get_model_info, ...")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    s.add_argument("--port", type=int, default=30000, help="port to bind; 0 picks a free one (default: %(default)s)")
    s.add_argument("--backend", choices=("builtin", "transformers"), default="builtin",
                   help="builtin: no weights; transformers: a seeded random-weight MoE model on CPU "
                        "(--model tiny-qwen3-moe; logprobs and routed experts from its forward pass) (default: %(default)s)")
    s.add_argument("--model", default=None,
                   help=f"model preset: {', '.join(MODEL_PRESETS)} (default {DEFAULT_MODEL}; "
                        "tiny-qwen3-moe with --backend transformers)")
    s.add_argument("--num-layers", type=int, help="override the preset's recorded MoE layers")
    s.add_argument("--num-experts", type=int, help="override the preset's experts per layer")
    s.add_argument("--topk", type=int, help="override the preset's routing top-k")
    s.add_argument("--vocab-size", type=int, help="override the preset's vocabulary size")
    s.add_argument("--seed", type=int, default=0, help="output is a pure function of seed, prompt, sampling (default: %(default)s)")
    s.add_argument("--tokenizer", default=None,
                   help="'byte' (built in; the default), 'qwen3' (the default with --backend transformers), "
                        "'qwen3.5' / 'qwen3.6', or a local Hugging Face tokenizer folder")
    s.add_argument("--tool-call-rate", type=float, default=0.0,
                   help="share of replies that are <tool_call> blocks when the prompt offers tools (default: %(default)s)")
    s.add_argument("--answer-tool-results", action="store_true",
                   help="reply in prose after tool results (with --tool-call-rate 1: one tool round trip "
                        "per task, then an answer)")
    s.add_argument("--token-delay", type=float, default=0.0, metavar="SECONDS",
                   help="wall time per generated token (lets pause/abort land mid-generation) (default: %(default)s)")
    s.add_argument("--mean-response-tokens", type=int, default=256, help="mean drawn reply length (default: %(default)s)")
    s.add_argument("--default-max-new-tokens", type=int, default=128,
                   help="max_new_tokens when a request leaves it out (default: %(default)s)")
    s.add_argument("--context-length", type=int, default=262_144, help="longest prompt + reply accepted (default: %(default)s)")
    s.add_argument("--stream-interval", type=int, default=8, help="tokens per streamed chunk (default: %(default)s)")
    s.add_argument("--incremental-streaming-output", action="store_true",
                   help="streamed chunks carry only new tokens (as SGLang's flag)")
    s.add_argument("--weight-version", default="default", help="initial meta_info.weight_version (default: %(default)s)")
    s.add_argument("--served-model-name", help="name reported by /get_model_info")
    s.add_argument("--enable-return-routed-experts", action="store_true",
                   help="accepted for SGLang compatibility; routed experts are always available")
    s.add_argument("--log-level", default="warning", help="uvicorn log level (default: %(default)s)")
    s.set_defaults(func=_serve)


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    real = args.backend == "transformers"
    name = args.model or ("tiny-qwen3-moe" if real else DEFAULT_MODEL)
    model = model_from_preset(name, num_layers=args.num_layers, num_experts=args.num_experts,
                              topk=args.topk, vocab_size=args.vocab_size)
    tokenizer = args.tokenizer or ("qwen3" if real else "byte")
    return EngineConfig(
        model=model, backend=args.backend, seed=args.seed, tokenizer=tokenizer, host=args.host, port=args.port,
        tool_call_rate=args.tool_call_rate, answer_tool_results=args.answer_tool_results,
        token_delay_s=args.token_delay,
        mean_response_tokens=args.mean_response_tokens, default_max_new_tokens=args.default_max_new_tokens,
        context_length=args.context_length, stream_interval=args.stream_interval,
        incremental_streaming_output=args.incremental_streaming_output, weight_version=args.weight_version,
        served_model_name=args.served_model_name, log_level=args.log_level,
    )


def _serve(args: argparse.Namespace) -> int:
    from dressage.engine.server import EngineServer

    config = config_from_args(args)
    server = EngineServer(config)
    m = config.model
    print(f"dressage engine ({config.backend}): {m.name} ({m.num_layers} layers x top-{m.topk} of {m.num_experts} experts), "
          f"tokenizer {config.tokenizer}, seed {config.seed}, on http://{config.host}:{config.port}",
          file=sys.stderr, flush=True)
    server.serve()
    return 0
