"""The sessions curve of ``dressage bench scale``: the Proxy's own share of latency as sessions grow.

N agent sessions run at once, each a few multi-turn chat calls (TITO and Segment building run) through
a Proxy process over HTTP to a stub SGLang engine process (:mod:`dressage_bench.stub_engine`) that holds
every ``/generate`` a fixed service time. A call's own share is its latency as the agent sees it less
that service time; the same agents calling the engine directly (no Proxy) in the same run give the
floor (the client, loopback HTTP, the stub). Sessions start spread over one call's period and think a
random while between turns, so calls arrive at a steady ``N / (service + think)`` per second rather
than in lockstep bursts.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import dataclass
from typing import Any


from dressage_bench._timing import percentile_ms
from dressage_bench.faults._stack import engine_wait_s

__all__ = ["SessionsConfig", "VARIANTS", "SESSIONS_BOUND", "run_sessions_curve", "plot_sessions", "start_stub"]

SESSIONS_BOUND = 3.0
"""The Proxy's own-share p99 at the largest session count over its p99 at the reference count (64)."""
REFERENCE_SESSIONS = 64
VARIANTS = {"logprobs": False, "r3": True}
"""What the engine answers besides ids: ``output_token_logprobs`` only, or with R3 routed experts too."""


@dataclass(frozen=True, slots=True)
class SessionsConfig:
    """One run of the sessions curve."""

    sessions: tuple[int, ...] = (16, 64, 256, 1024)
    """Concurrent agent sessions per point."""
    turns: int = 3
    """Chat calls per session (each after the previous one's reply: a growing conversation)."""
    service_s: float = 8.0
    """The stub engine's time per call; the Proxy's call rate is about ``N / (service_s + think_s / 2)``."""
    think_s: float = 4.0
    """An agent waits a uniform random time up to this between turns (its tools, its own model)."""
    variants: tuple[str, ...] = ("logprobs", "r3")
    """Which engine answers to measure (:data:`VARIANTS`)."""
    layers: int = 16
    """R3 layers of the stub's model (the ``r3`` variant)."""
    topk: int = 4
    """R3 experts per token per layer."""
    experts: int = 64
    """Routed experts per layer (the ids fit the ``uint8`` the Proxy stores)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.sessions or min(self.sessions) < 1:
            raise ValueError(f"SessionsConfig.sessions: session counts must be >= 1, got {self.sessions!r}")
        if self.turns < 1:
            raise ValueError(f"SessionsConfig.turns must be >= 1, got {self.turns!r}")
        if not (self.service_s > 0 and self.think_s >= 0):
            raise ValueError(f"SessionsConfig.service_s must be > 0 and think_s >= 0, got "
                             f"{self.service_s!r}, {self.think_s!r}")
        unknown = sorted(set(self.variants) - set(VARIANTS))
        if unknown or not self.variants:
            raise ValueError(f"SessionsConfig.variants: unknown {unknown} (known: {sorted(VARIANTS)})")


def start_stub(cfg: Any) -> Any:
    """Start the stub engine (a :class:`~dressage_bench.stub_engine.StubConfig`) as a child process; its
    ``Served`` once ``/health`` answers."""
    from dressage_bench.faults._stack import free_port, serve_child

    port = free_port()
    return serve_child([sys.executable, "-m", "dressage_bench.stub_engine", "--port", str(port),
                        "--service-s", str(cfg.service_s), "--layers", str(cfg.layers), "--topk", str(cfg.topk),
                        "--experts", str(cfg.experts)], port, "the stub engine")


@dataclass(slots=True)
class _Calls:
    """What one path's calls came to."""

    own: list[float]
    own_outside_engine: list[float]
    errors: int
    wall_s: float


async def _agents(cfg: SessionsConfig, n: int, call: Any, seed: int, begin: Any = None) -> _Calls:
    """``n`` sessions at once; ``begin(i)`` (untimed) opens session ``i``; ``call(i, messages)`` makes one
    chat call and returns the reply's message and the engine wait the Proxy reported (or None)."""
    rng = random.Random(seed)
    own: list[float] = []
    outside: list[float] = []
    errors = 0
    period = cfg.service_s + cfg.think_s / 2

    async def one(i: int, start: float, thinks: list[float]) -> None:
        nonlocal errors
        await asyncio.sleep(start)
        if begin is not None:
            try:
                await begin(i)
            except Exception:  # noqa: BLE001 - counted as the session's calls not made
                errors += 1
                return
        msgs: list[dict] = [{"role": "user", "content": f"Session {i}: list some primes, then explain them."}]
        for t in range(cfg.turns):
            t0 = time.perf_counter()
            try:
                message, engine_s = await call(i, msgs)
            except Exception:  # noqa: BLE001 - counted, the curve reports errors per point
                errors += 1
                return
            lat = time.perf_counter() - t0
            own.append(lat - cfg.service_s)
            if engine_s is not None:
                outside.append(lat - engine_s)
            msgs = msgs + [message, {"role": "user", "content": "More, with a reason for each."}]
            if t + 1 < cfg.turns:
                await asyncio.sleep(thinks[t])

    plan = [(rng.uniform(0, period), [rng.uniform(0, cfg.think_s) for _ in range(cfg.turns)]) for _ in range(n)]
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i, s, th) for i, (s, th) in enumerate(plan)))
    return _Calls(own, outside, errors, time.perf_counter() - t0)


async def _post_json(pool: Any, url: str, body: dict) -> tuple[Any, Any]:
    """POST ``body`` as JSON on ``pool`` (an aiohttp transport); the response and its decoded JSON."""
    from dressage.proxy import fastjson

    resp = await pool.send("POST", url, body=fastjson.dumps(body), headers={"content-type": "application/json"},
                           timeout=600)
    try:
        data = await resp.read()
    finally:
        await resp.aclose()
    if resp.status != 200:
        raise RuntimeError(f"POST {url}: HTTP {resp.status}: {data[:200]!r}")
    return resp, fastjson.loads(data)


async def _through_proxy(cfg: SessionsConfig, url: str, n: int, seed: int) -> _Calls:
    from dressage.proxy.engines.aio_transport import AiohttpTransport

    pool = AiohttpTransport(n + 8)
    sids: dict[int, str] = {}

    async def post(path: str, body: dict) -> tuple[Any, Any]:
        return await _post_json(pool, url + path, body)

    async def begin(i: int) -> None:
        sids[i] = (await post("/sessions", {"metadata": {"group_index": i}}))[1]["session_id"]

    async def call(i: int, msgs: list[dict]) -> tuple[dict, float | None]:
        resp, reply = await post(f"/sessions/{sids[i]}/v1/chat/completions",
                                 {"model": "m", "messages": msgs, "max_tokens": 64})
        message = {k: v for k, v in reply["choices"][0]["message"].items() if v is not None}
        return message, engine_wait_s(resp.headers.get("server-timing", ""))

    try:
        out = await _agents(cfg, n, call, seed, begin)
        await asyncio.gather(*(post(f"/sessions/{sid}/finalize", {"reward": 1.0}) for sid in sids.values()))
    finally:
        await pool.aclose()
    return out


async def _direct(cfg: SessionsConfig, url: str, n: int, seed: int, r3: bool) -> _Calls:
    """The same agents, the same prompts rendered the way the Proxy renders them, straight to the engine."""
    from dressage.proxy.engines.aio_transport import AiohttpTransport
    from dressage.tokenizer import load_tokenizer

    tok = load_tokenizer("byte")
    pool = AiohttpTransport(n + 8)

    async def call(i: int, msgs: list[dict]) -> tuple[dict, None]:
        body = {"input_ids": tok.apply_chat_template(msgs, None, True), "sampling_params": {"max_new_tokens": 64},
                "return_logprob": True}
        if r3:
            body.update(return_routed_experts=True, routed_experts_start_len=0)
        answer = (await _post_json(pool, url + "/generate", body))[1]
        return {"role": "assistant", "content": answer["text"]}, None

    try:
        return await _agents(cfg, n, call, seed)
    finally:
        await pool.aclose()


def _proxy_args(cfg: SessionsConfig, stub_url: str, r3: bool) -> list[str]:
    args = ["proxy", "serve", "--engine-url", stub_url, "--enable-transfer-queue", "--transfer_queue.retention_s", "60",
            "--num-layers", str(cfg.layers), "--topk", str(cfg.topk), "--num-experts", str(cfg.experts)]
    if r3:
        args += ["--use-rollout-routing-replay", "--routed-experts-dtype", "uint8"]
    return args


def _gc(url: str) -> dict[str, Any]:
    """The Proxy's collector pauses so far (``GET /trajectory/stats``)."""
    import httpx

    return httpx.get(url + "/trajectory/stats", timeout=60).json()["gc"]


def _point(cfg: SessionsConfig, stub: Any, variant: str, n: int) -> dict[str, Any]:
    """One session count of one variant: a fresh Proxy warmed by 8 sessions of 2 turns, then the N sessions
    through it, then the same N agents straight to the engine."""
    from dressage_bench.faults._stack import serve_process

    r3 = VARIANTS[variant]
    proxy = serve_process(_proxy_args(cfg, stub.url, r3))
    try:
        warm = SessionsConfig(sessions=(8,), turns=2, service_s=cfg.service_s, think_s=0.0)
        asyncio.run(_through_proxy(warm, proxy.url, 8, cfg.seed + 1))
        cpu0, gc0 = proxy.cpu_s(), _gc(proxy.url)
        p = asyncio.run(_through_proxy(cfg, proxy.url, n, cfg.seed + n))
        proxy_cpu, gc1 = proxy.cpu_s() - cpu0, _gc(proxy.url)
    finally:
        proxy.stop()
    d = asyncio.run(_direct(cfg, stub.url, n, cfg.seed + n, r3))
    calls = n * cfg.turns
    return {"variant": variant, "sessions": n, "calls": len(p.own), "direct_calls": len(d.own),
            "errors": 2 * calls - len(p.own) - len(d.own),  # calls not answered, on either path
            "offered_calls_per_s": round(n / (cfg.service_s + cfg.think_s / 2), 1),
            "proxy_calls_per_s": round(len(p.own) / p.wall_s, 1),
            "proxy_cpu_ms_per_call": round(proxy_cpu * 1000.0 / max(1, len(p.own)), 3),
            "proxy_cpu_share": round(proxy_cpu / p.wall_s, 3),
            "proxy_own_p50_ms": round(percentile_ms(p.own, 50), 2), "proxy_own_p99_ms": round(percentile_ms(p.own, 99), 2),
            "proxy_own_max_ms": round(max(p.own) * 1000.0, 2) if p.own else float("nan"),
            "proxy_outside_engine_wait_p99_ms": round(percentile_ms(p.own_outside_engine, 99), 2),
            "direct_own_p50_ms": round(percentile_ms(d.own, 50), 2), "direct_own_p99_ms": round(percentile_ms(d.own, 99), 2),
            # the Proxy's collector over the timed sessions (its longest pause: since the Proxy started)
            "proxy_gc_collections": gc1["collections"] - gc0["collections"],
            "proxy_gc_full_collections": gc1["full_collections"] - gc0["full_collections"],
            "proxy_gc_pause_ms": round((gc1["pause_s"] - gc0["pause_s"]) * 1e3, 2),
            "proxy_gc_max_pause_ms": gc1["max_pause_ms"]}


def run_sessions_curve(cfg: SessionsConfig) -> dict[str, Any]:
    """Every (variant, session count) point, and the bound: p99 at the largest count over p99 at 64
    (at the smallest count when 64 is not measured or is the largest), each variant."""
    from dressage_bench.stub_engine import StubConfig

    stub = start_stub(StubConfig(service_s=cfg.service_s, layers=cfg.layers, topk=cfg.topk, experts=cfg.experts))
    try:
        points = [_point(cfg, stub, v, n) for v in cfg.variants for n in sorted(cfg.sessions)]
    finally:
        stub.stop()
    top_n = max(cfg.sessions)
    ref_n = REFERENCE_SESSIONS if REFERENCE_SESSIONS in cfg.sessions and top_n > REFERENCE_SESSIONS \
        else min(cfg.sessions)
    ratios = {}
    for v in cfg.variants:
        by_n = {p["sessions"]: p for p in points if p["variant"] == v}
        ratios[v] = by_n[top_n]["proxy_own_p99_ms"] / max(by_n[ref_n]["proxy_own_p99_ms"], 1e-3)
    worst = max(ratios.values())
    return {"config": {"sessions": list(cfg.sessions), "turns": cfg.turns, "service_s": cfg.service_s,
                       "think_s": cfg.think_s, "r3_shape": [cfg.layers, cfg.topk]},
            "points": points,
            "bounds": {"own_p99_vs_reference": {
                "limit": SESSIONS_BOUND, "worst": worst, "met": worst <= SESSIONS_BOUND, "at_sessions": top_n,
                "reference_sessions": ref_n, "by_variant": ratios}}}


def plot_sessions(curve: dict[str, Any], path: str) -> None:
    """Own-share p50 and p99 per session count, each variant, the direct calls' beside them."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant in dict.fromkeys(p["variant"] for p in curve["points"]):
        pts = [p for p in curve["points"] if p["variant"] == variant]
        n = [p["sessions"] for p in pts]
        ax.plot(n, [p["proxy_own_p99_ms"] for p in pts], marker="o", label=f"Proxy own p99 ({variant})")
        ax.plot(n, [p["proxy_own_p50_ms"] for p in pts], marker=".", linestyle=":", label=f"Proxy own p50 ({variant})")
        ax.plot(n, [p["direct_own_p99_ms"] for p in pts], marker="s", linestyle="--",
                label=f"direct engine call p99 ({variant})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent agent sessions")
    ax.set_ylabel("latency less the engine's service time (ms)")
    b = curve["bounds"]["own_p99_vs_reference"]
    ax.set_title(f"Sessions curve: own-share p99 at {b['at_sessions']} / at {b['reference_sessions']} = "
                 f"{b['worst']:.2f}x (bound {b['limit']:g}x)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
