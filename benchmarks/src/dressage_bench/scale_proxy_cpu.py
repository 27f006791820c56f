"""The Proxy-CPU column of ``dressage bench scale``'s Step curve: a whole chat call's CPU in the Proxy process.

A ``dressage proxy serve`` process (TransferQueue on, embedded, R3 on) in front of the stub SGLang engine
(:mod:`dressage_bench.stub_engine`) serves chat calls whose prompt makes a Step of T tokens (byte tokenizer:
one token per byte). The Proxy process's CPU time (user + system, every thread) over the calls, the TQ
write behind them included, is set against a bare ``a2b_base64`` of the same routing string timed in this
process: everything the Proxy does per call (HTTP in and out, JSON, the R3 decode, TITO and the Step, the
TQ put) against the one pass it cannot avoid.
"""

from __future__ import annotations

import binascii
import math
import time
from typing import Any

import numpy as np
import psutil

__all__ = ["PROXY_CPU_BOUND", "OUTPUT_TOKENS", "run_proxy_cpu_curve", "prompt_for"]

PROXY_CPU_BOUND = 1.5
"""Proxy CPU per int32 Step over a bare base64 decode of its routing string."""
OUTPUT_TOKENS = 16
EXPERTS = 256
_ROUND_FLOOR_S = 0.5
"""A round makes enough calls for about this much bare-decode CPU: the Proxy's CPU clock
(``/proc``) ticks in 10 ms, so a round of a small Step is several calls."""
_ROUND_MAX_CALLS = 64
_ROUND_MAX_BYTES = 1 << 30
"""A round's Steps stay stored until it ends (their sessions are discarded after the clock): at most
this many routing-string bytes of them."""


def prompt_for(tokens: int) -> tuple[list[dict], int]:
    """A one-message chat whose rendered prompt is ``tokens - OUTPUT_TOKENS`` byte-tokenizer ids, and that count."""
    from dressage.tokenizer import load_tokenizer

    tok = load_tokenizer("byte")
    overhead = len(tok.apply_chat_template([{"role": "user", "content": ""}], None, True))
    want = tokens - OUTPUT_TOKENS
    if want <= overhead:
        raise ValueError(f"a {tokens}-token Step needs more than {overhead + OUTPUT_TOKENS} tokens")
    msgs = [{"role": "user", "content": "a" * (want - overhead)}]
    got = len(tok.apply_chat_template(msgs, None, True))
    if got != want:
        raise AssertionError(f"the byte tokenizer rendered {got} prompt ids, not {want}")
    return msgs, want


def _wait_written(client: Any, url: str) -> int:
    """Poll ``GET /trajectory/stats`` until no Step's TQ write is pending; how many polls it took. The polls
    back off (10 ms doubling to 200 ms) so they add little to what is measured."""
    delay, polls = 0.01, 0
    while True:
        time.sleep(delay)
        polls += 1
        if client.get(url + "/trajectory/stats").json()["pending_writes"] == 0:
            return polls
        delay = min(0.2, delay * 2)


def _simd_decoder() -> Any:
    """pybase64's SIMD decoder when its C extension is there (the Proxy's own decoder then uses it)."""
    try:
        import pybase64
    except ImportError:
        return None
    return pybase64.b64decode if "C extension active" in pybase64.get_version() else None


def _bare_s(raw: bytes, n: int, decode: Any = binascii.a2b_base64) -> float:
    t0 = time.process_time()
    for _ in range(n):
        np.frombuffer(decode(raw), dtype=np.int32)
    return max((time.process_time() - t0) / n, 1e-9)


def _point(client: Any, proxy: Any, routing: bytes, tokens: int, layers: int, topk: int, dtype: str,
           rounds: int) -> dict[str, Any]:
    """One Step size on a running Proxy: a warm-up call, then ``rounds`` rounds, each the Proxy's CPU over
    ``calls`` chat calls (one fresh session each, created before and discarded after the clock) and the
    bare decode of the same routing string, taking turns."""
    msgs, prompt_len = prompt_for(tokens)
    bare_n = max(1, min(1000, int(2e-3 / _bare_s(routing, 1))))
    simd = _simd_decoder()
    simd_n = max(1, min(1000, int(2e-3 / _bare_s(routing, 1, simd)))) if simd else 0

    def call(sid: str) -> None:
        r = client.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions",
                        json={"model": "m", "messages": msgs, "max_tokens": OUTPUT_TOKENS})
        if r.status_code != 200:
            raise RuntimeError(f"chat call: HTTP {r.status_code}: {r.text[:300]}")
        usage = r.json()["usage"]
        if (usage["prompt_tokens"], usage["completion_tokens"]) != (prompt_len, OUTPUT_TOKENS):
            raise AssertionError(f"the Step is {usage}, not {prompt_len} + {OUTPUT_TOKENS} tokens")

    def sessions(n: int) -> list[str]:
        return [client.post(proxy.url + "/sessions", json={}).json()["session_id"] for _ in range(n)]

    def discard(sids: list[str]) -> None:
        for sid in sids:
            client.post(proxy.url + "/session/discard", json={"session_id": sid}).raise_for_status()

    # Warm-up: one untimed call (the Proxy's pools and this Step size's buffers), and the bare decode's rate.
    (sid,) = sessions(1)
    call(sid)
    _wait_written(client, proxy.url)
    discard([sid])
    bare_once = _bare_s(routing, bare_n)
    calls = max(1, min(_ROUND_MAX_CALLS, _ROUND_MAX_BYTES // len(routing), math.ceil(_ROUND_FLOOR_S / bare_once)))
    proxy_s: list[float] = []
    bare_s: list[float] = []
    simd_s: list[float] = []
    polls = 0

    def proxy_round() -> None:
        nonlocal polls
        sids = sessions(calls)
        cpu0 = proxy.cpu_s()
        for sid in sids:
            call(sid)
        polls += _wait_written(client, proxy.url)
        proxy_s.append((proxy.cpu_s() - cpu0) / calls)
        discard(sids)

    def bare_round() -> None:
        bare_s.append(_bare_s(routing, bare_n))
        if simd:
            simd_s.append(_bare_s(routing, simd_n, simd))

    for r in range(rounds):
        for step in ((proxy_round, bare_round) if r % 2 == 0 else (bare_round, proxy_round)):
            step()
    med_p, med_b = float(np.median(proxy_s)), float(np.median(bare_s))
    best_p, best_b = min(proxy_s), min(bare_s)
    simd_fig = {}
    if simd_s:
        med_s = float(np.median(simd_s))
        simd_fig = {"simd_b64_decode_s": med_s, "proxy_cpu_vs_simd_b64": med_p / med_s}
    return {**simd_fig, "tokens": tokens, "layers": layers, "topk": topk, "dtype": dtype, "rounds": rounds,
            "calls_per_round": calls, "routing_bytes": len(routing), "stats_polls": polls,
            "proxy_cpu_s": med_p, "proxy_cpu_best_s": best_p, "b64_decode_s": med_b, "b64_decode_best_s": best_b,
            "proxy_cpu_vs_b64": med_p / med_b, "proxy_cpu_vs_b64_best": best_p / best_b}


def _proxy_args(stub_url: str, layers: int, topk: int, dtype: str) -> list[str]:
    return ["proxy", "serve", "--engine-url", stub_url, "--enable-transfer-queue",
            "--transfer_queue.retention_s", "60", "--num-layers", str(layers), "--topk", str(topk),
            "--num-experts", str(EXPERTS), "--use-rollout-routing-replay", "--routed-experts-dtype", dtype,
            "--max-engine-answer-bytes", str(2 << 30), "--request-timeout", "1200"]


def run_proxy_cpu_curve(sizes: list[int], shapes: dict[str, tuple[int, int]], dtypes: list[str],
                        rounds: int) -> dict[str, Any]:
    """Every (shape, dtype, size) point: one stub engine per shape, one Proxy per shape and dtype. The
    bound is judged on the int32 points (the uint8 ones are reported beside them)."""
    import httpx

    from dressage_bench.faults._stack import serve_process
    from dressage_bench.scale_sessions import start_stub
    from dressage_bench.stub_engine import StubConfig, routing_b64

    points = []
    with httpx.Client(timeout=1200) as client:
        for layers, topk in shapes.values():
            cfg = StubConfig(service_s=0.0, layers=layers, topk=topk, experts=EXPERTS)
            stub = start_stub(cfg)
            try:
                for dtype in dtypes:
                    proxy = serve_process(_proxy_args(stub.url, layers, topk, dtype))
                    try:
                        if psutil.Process(proxy.proc.pid).children():
                            raise RuntimeError("the Proxy runs child processes: its CPU would be missed")
                        for tokens in sizes:
                            # the very routing string the stub answers for a T-token Step (rows [0, T - 1))
                            routing = routing_b64(cfg, tokens - 1).encode("ascii")
                            points.append(_point(client, proxy, routing, tokens, layers, topk, dtype, rounds))
                            del routing
                    finally:
                        proxy.stop()
            finally:
                stub.stop()
    int32 = [p["proxy_cpu_vs_b64"] for p in points if p["dtype"] == "int32"]
    worst = max(int32) if int32 else float("nan")
    return {"points": points,
            "bound": {"limit": PROXY_CPU_BOUND, "worst": worst, "met": bool(int32) and worst <= PROXY_CPU_BOUND}}
