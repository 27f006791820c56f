"""A fast SGLang-protocol engine for the sessions curve: every ``/generate`` waits a fixed service time.

It speaks the wire the Proxy speaks to SGLang (``/generate`` with ``output_token_logprobs`` and, when
asked, base64 int32 ``meta_info.routed_experts`` rows ``[routed_experts_start_len, T - 1)``;
``/model_info``, ``/get_server_info``, ``/health``) over a bare asyncio HTTP/1.1 server, so its own
CPU per call stays small beside the Proxy's and the curve measures the Proxy, not the engine.
Each answer carries ``x-engine-service-ms``: the time it held the call, for the direct baseline.
Run as ``python -m dressage_bench.stub_engine --port P --service-s S``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dressage.fields.sglang import encode_routed_experts_b64
from dressage.proxy import fastjson

__all__ = ["StubConfig", "REPLY", "main", "routing_b64", "serve"]

REPLY = "The first primes are 2, 3, 5, 7, 11, 13, 17, 19, 23 and 29; the next are 31, 37 and 41."
"""What every call answers (byte tokenizer ids, then ``<|im_end|>``): a realistic few dozen tokens."""
_IM_END = 258


@dataclass(frozen=True, slots=True)
class StubConfig:
    """What the stub answers with."""

    service_s: float = 0.5
    """How long each ``/generate`` waits (``asyncio.sleep``, at least this long) before it answers: the
    engine's own time."""
    layers: int = 8
    """R3 rows' layers (``num_hidden_layers`` of its model info)."""
    topk: int = 2
    """Experts per token per layer."""
    experts: int = 64
    """Routed experts per layer."""

    def __post_init__(self) -> None:
        if not self.service_s >= 0:
            raise ValueError(f"StubConfig.service_s must be >= 0, got {self.service_s!r}")
        for name in ("layers", "topk", "experts"):
            if getattr(self, name) < 1:
                raise ValueError(f"StubConfig.{name} must be >= 1, got {getattr(self, name)!r}")


def routing_b64(cfg: StubConfig, rows: int) -> str:
    """The routing string the stub answers for ``rows`` rows: SGLang's wire form (base64 of int32 ids
    ``[rows, layers, topk]``), ids a fixed pattern below ``experts``."""
    r = (np.arange(rows * cfg.layers * cfg.topk, dtype=np.int64) * 7 % cfg.experts).astype(np.int32)
    return encode_routed_experts_b64(r.reshape(rows, cfg.layers, cfg.topk))


class _Answers:
    """Bodies of the stub's answers; routing strings cached by row count (the agents' prompts repeat sizes)."""

    def __init__(self, cfg: StubConfig) -> None:
        self.cfg = cfg
        self.ids = list(REPLY.encode("utf-8")) + [_IM_END]
        self.logprobs = [[-0.01 * (i % 31), t, None] for i, t in enumerate(self.ids)]
        self.routing = lru_cache(maxsize=4096)(lambda rows: routing_b64(cfg, rows))
        self.model_info = fastjson.dumps({
            "model_path": "stub", "tokenizer_path": "byte", "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default",
            "num_hidden_layers": cfg.layers, "num_experts_per_tok": cfg.topk, "num_experts": cfg.experts})
        self.server_info = fastjson.dumps({"context_length": 1 << 20, "enable_return_routed_experts": True,
                                           "version": "dressage-bench-stub"})

    def generate(self, body: dict) -> bytes:
        prompt = len(body["input_ids"])
        want = int((body.get("sampling_params") or {}).get("max_new_tokens") or len(self.ids))
        n = min(want, len(self.ids))
        ids = self.ids[:n]
        finish = {"type": "stop", "matched": _IM_END} if n == len(self.ids) else {"type": "length", "length": n}
        meta: dict = {"id": body.get("rid") or "stub", "finish_reason": finish, "prompt_tokens": prompt,
                      "weight_version": "default", "completion_tokens": n, "cached_tokens": 0}
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = self.logprobs[:n]
        if body.get("return_routed_experts"):
            start = int(body.get("routed_experts_start_len") or 0)
            meta["routed_experts"] = self.routing(max(0, prompt + n - 1 - start))
        text = bytes(t for t in ids if t < 256).decode("utf-8")
        return fastjson.dumps({"text": text, "output_ids": ids, "meta_info": meta})


def _response(status: int, body: bytes, extra: str = "") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{extra}\r\n").encode("ascii") + body


async def _connection(answers: _Answers, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length) if length else b""
            path = path.split("?", 1)[0]
            if path == "/generate" and method in ("POST", "PUT"):
                t0 = time.perf_counter()
                try:
                    req = fastjson.loads(body)
                    # never less than the service time: a loop's timers may fire a little early
                    until = t0 + answers.cfg.service_s
                    while (left := until - time.perf_counter()) > 0:
                        await asyncio.sleep(left)
                    out = answers.generate(req)
                except (ValueError, KeyError, TypeError) as exc:
                    writer.write(_response(400, fastjson.dumps({"error": {"message": str(exc)}})))
                else:
                    ms = (time.perf_counter() - t0) * 1000.0
                    writer.write(_response(200, out, f"x-engine-service-ms: {ms:.3f}\r\n"))
            elif path in ("/model_info", "/get_model_info"):
                writer.write(_response(200, answers.model_info))
            elif path == "/get_server_info":
                writer.write(_response(200, answers.server_info))
            elif path in ("/health", "/health_generate"):
                writer.write(_response(200, b""))
            elif path == "/get_weight_version":
                writer.write(_response(200, b'{"weight_version":"default"}'))
            else:
                writer.write(_response(404, b'{"error":{"message":"not found"}}'))
            await writer.drain()
    finally:
        writer.close()


async def serve(cfg: StubConfig, host: str, port: int) -> None:
    """Serve until cancelled."""
    answers = _Answers(cfg)
    server = await asyncio.start_server(lambda r, w: _connection(answers, r, w), host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    d = StubConfig()
    p = argparse.ArgumentParser(prog="python -m dressage_bench.stub_engine", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--service-s", type=float, default=d.service_s)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--topk", type=int, default=d.topk)
    p.add_argument("--experts", type=int, default=d.experts)
    a = p.parse_args(argv)
    cfg = StubConfig(service_s=a.service_s, layers=a.layers, topk=a.topk, experts=a.experts)
    try:
        import uvloop
        uvloop.run(serve(cfg, a.host, a.port))
    except ImportError:
        asyncio.run(serve(cfg, a.host, a.port))


if __name__ == "__main__":
    main()
