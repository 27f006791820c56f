"""Load: many concurrent agent sessions against one Proxy, and the same calls straight to the engine.

Throughput is model calls per second; the Proxy's added latency is its per-call latency minus the
engine's for the same prompts, measured in the same run at the same concurrency, after a warm-up
round of each and over rounds that alternate the two. The Proxy's own
cost is its process's CPU time (user + system, tokenization and the embedded TransferQueue included)
over the calls it served, and the same without the tokenizer's share (the CPU time the Proxy's own
tokenizer calls took, summed by the Proxy with ``thread_time``); the engine's CPU time per call in
the direct run is the same-run yardstick.

The agents' driver posts both runs' calls through the same aiohttp pool with orjson bodies, so what
the driver itself costs per call is alike on both sides and the difference is the Proxy's. The same
calls made through the openai SDK (pydantic models, httpx) are a second Proxy run, reported under
``sdk``: on two shared cores the SDK's own CPU per call is larger than the Proxy's, and it shows up
as latency of every process on the machine.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from dressage_bench._timing import percentile_ms as _pct
from dressage_bench.faults._stack import engine_wait_s, serve_process
from dressage_bench.faults.runner import FaultsConfig, case
from dressage.proxy import fastjson
from dressage.proxy.engines.aio_transport import AiohttpTransport
from dressage.proxy.engines.sglang_client import SGLangClient
from dressage.proxy.engines.transport import EngineTransportError
from dressage.tokenizer import load_tokenizer


def _tokenizer_cpu_s(served: Any) -> float:
    """The CPU time the Proxy's tokenizer calls took, as the Proxy measured it (``/trajectory/stats``)."""
    return float(httpx.get(served.url + "/trajectory/stats", timeout=30).json()["tokenizer_cpu_s"])


def _engine_wait_s(server_timing: str) -> float:
    wait = engine_wait_s(server_timing)
    if wait is None:
        raise RuntimeError(f"no engine entry in Server-Timing {server_timing!r}")
    return wait


async def _through_proxy_lean(url: str, sessions: int, turns: int, concurrency: int, own: list[float],
                              pool: AiohttpTransport) -> tuple[list[float], list, int]:
    """The agents' calls as plain JSON posts on ``pool`` (the transport the direct run's engine client
    uses, kept open by the caller across rounds); ``own`` gets each
    call's latency less the engine wait the Proxy reports for it. The prompts come back per session,
    in turn order, for the direct run to replay the same way."""
    lat: list[float] = []
    prompts: list[list] = [[] for _ in range(sessions)]
    errors = 0
    gate = asyncio.Semaphore(concurrency)
    headers = {"content-type": "application/json"}

    async def post(path: str, body: dict) -> Any:
        resp = await pool.send("POST", url + path, body=fastjson.dumps(body), headers=headers, timeout=120)
        try:
            return resp, fastjson.loads(await resp.read())
        finally:
            await resp.aclose()

    async def one(i: int) -> None:
        nonlocal errors
        async with gate:
            sid = (await post("/sessions", {"metadata": {"group_index": i}}))[1]["session_id"]
            msgs = [{"role": "user", "content": f"Session {i}: list some primes."}]
            for _ in range(turns):
                t0 = time.perf_counter()
                prompts[i].append(list(msgs))
                resp, reply = await post(f"/sessions/{sid}/v1/chat/completions",
                                         {"model": "m", "messages": msgs, "max_tokens": 32})
                if resp.status != 200:
                    errors += 1
                    return
                lat.append(time.perf_counter() - t0)
                own.append(lat[-1] - _engine_wait_s(resp.headers.get("server-timing", "")))
                message = {k: v for k, v in reply["choices"][0]["message"].items() if v is not None}
                msgs = msgs + [message, {"role": "user", "content": "More."}]
            await post(f"/sessions/{sid}/finalize", {"reward": 1.0})
    await asyncio.gather(*(one(i) for i in range(sessions)))
    return lat, prompts, errors


class _SdkTransport(httpx.AsyncBaseTransport):
    """httpx's transport interface over an engine transport, for the openai SDK (which speaks httpx only):
    httpx's own pool costs the driver several times the Proxy's CPU per call on the cores they share."""

    _SKIP = frozenset({"host", "content-length", "transfer-encoding", "connection", "accept-encoding"})

    def __init__(self, transport: AiohttpTransport) -> None:
        self.transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in self._SKIP}
        timeout = (request.extensions.get("timeout") or {}).get("read") or 120.0
        try:
            resp = await self.transport.send(request.method, str(request.url), body=(await request.aread()) or None,
                                             headers=headers, timeout=timeout)
            try:
                body = await resp.read()
            finally:
                await resp.aclose()
        except EngineTransportError as exc:
            raise getattr(httpx, exc.kind, httpx.TransportError)(str(exc), request=request) from exc
        fields = [(k, v) for k, v in resp.headers.items() if k.lower() != "content-encoding"]  # read decoded
        return httpx.Response(resp.status, headers=fields, content=body)

    async def aclose(self) -> None:
        await self.transport.aclose()


async def _through_proxy(url: str, sessions: int, turns: int, concurrency: int) -> tuple[list[float], list, int]:
    """The same calls through the openai SDK, as agent frameworks make them."""
    lat: list[float] = []
    prompts: list = []  # the messages of every call, rendered later for the direct run
    errors = 0
    gate = asyncio.Semaphore(concurrency)
    # The agents' client rides the same connection pool as the Proxy's engine client (and the direct
    # run's), so the added latency is the Proxy's, not a difference between HTTP client pools.
    async with httpx.AsyncClient(timeout=120, transport=_SdkTransport(AiohttpTransport(concurrency))) as h:
        async def one(i: int) -> None:
            nonlocal errors
            async with gate:
                sid = (await h.post(url + "/sessions", json={"metadata": {"group_index": i}})).json()["session_id"]
                client = openai.AsyncOpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="none", http_client=h,
                                            max_retries=0)
                msgs = [{"role": "user", "content": f"Session {i}: list some primes."}]
                for _ in range(turns):
                    t0 = time.perf_counter()
                    prompts.append(list(msgs))
                    try:
                        r = await client.chat.completions.create(model="m", messages=msgs, max_tokens=32)
                    except openai.APIError:
                        errors += 1
                        return
                    lat.append(time.perf_counter() - t0)
                    msgs = msgs + [r.choices[0].message.model_dump(exclude_none=True),
                                   {"role": "user", "content": "More."}]
                await h.post(f"{url}/sessions/{sid}/finalize", json={"reward": 1.0})
        await asyncio.gather(*(one(i) for i in range(sessions)))
    return lat, prompts, errors


async def _direct_on(client: SGLangClient, sessions: list[list[list[int]]], concurrency: int) -> list[float]:
    """The Proxy run's calls straight to the engine, as it made them: each session's turns one after
    the other, ``concurrency`` sessions at a time (not every prompt in one burst, whose queue would be
    the engine's tail latency and no one's in the Proxy run)."""
    lat: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    async def one(turns: list[list[int]]) -> None:
        async with gate:
            for ids in turns:
                t0 = time.perf_counter()
                await client.generate(ids, {"max_new_tokens": 32}, return_logprob=True, return_routed_experts=True)
                lat.append(time.perf_counter() - t0)
    await asyncio.gather(*(one(t) for t in sessions))
    return lat


@dataclass(slots=True)
class _Tally:
    """What the timed rounds of one path add up to."""

    lat: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    driver_s: float = 0.0


async def _atimed(tally: _Tally, served: Any, run: Any) -> Any:
    """Await one round (a coroutine), adding its wall time, ``served``'s CPU time and the driver's to
    ``tally``."""
    t0, cpu0, drv0 = time.perf_counter(), served.cpu_s(), time.process_time()
    out = await run
    tally.wall_s += time.perf_counter() - t0
    tally.cpu_s += served.cpu_s() - cpu0
    tally.driver_s += time.process_time() - drv0
    return out


@case("load")
def load(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    """One untimed warm-up round through the Proxy and one straight to the engine, so neither side is
    measured cold (first connections, first pool and page allocations; the engine had always served the
    Proxy's round before its direct one); then ``load_rounds`` timed rounds, each the Proxy's run and then
    the same prompts direct, so both sides meet the same load on the machine. Latencies are pooled over
    the rounds (three rounds of 64 x 3 calls put about six calls above the p99 instead of two). The
    warm-up's own percentiles are reported as ``cold_proxy_p50_ms`` / ``cold_proxy_p99_ms``."""
    # Engine and Proxy in their own processes, as deployed: the driver's work does not share their GIL.
    engine = serve_process(["engine", "serve", "--model", "qwen3.6-35b-a3b", "--mean-response-tokens", "24",
                            "--seed", str(cfg.seed)])
    proxy = None
    conc, sessions, turns = cfg.load_sessions, cfg.load_sessions, cfg.load_turns
    tok = load_tokenizer("byte")

    def rendered(sessions_messages: list) -> list:
        return [[tok.apply_chat_template(m, None, True) for m in turns_] for turns_ in sessions_messages]

    try:
        proxy = serve_process(["proxy", "serve", "--engine-url", engine.url,
                               "--use-rollout-routing-replay", "--enable-transfer-queue",
                               "--routed-experts-dtype", "uint8"])
        p, d = _Tally(), _Tally()
        own: list[float] = []
        tok_cpu = 0.0

        async def rounds() -> tuple[list[float], int]:
            """Warm-up and timed rounds on one event loop, so the driver's pool to the Proxy and the
            direct run's engine client keep their connections from round to round (warm on both sides)."""
            nonlocal tok_cpu
            pool = AiohttpTransport(conc)
            try:
                async with SGLangClient(engine.url, timeout=120) as client:
                    cold, warm_messages, errs = await _through_proxy_lean(proxy.url, sessions, turns, conc, [], pool)
                    await _direct_on(client, rendered(warm_messages), conc)
                    for _ in range(cfg.load_rounds):
                        tok0 = _tokenizer_cpu_s(proxy)
                        lat, messages, e = await _atimed(p, proxy, _through_proxy_lean(
                            proxy.url, sessions, turns, conc, own, pool))
                        tok_cpu += _tokenizer_cpu_s(proxy) - tok0
                        p.lat += lat
                        errs += e
                        d.lat += await _atimed(d, engine, _direct_on(client, rendered(messages), conc))
            finally:
                await pool.aclose()
            return cold, errs

        cold, errors = asyncio.run(rounds())
        s = _Tally()
        lat_s, _, sdk_errors = asyncio.run(_atimed(s, proxy, _through_proxy(proxy.url, sessions, turns, conc)))
        s.lat = lat_s
        errors += sdk_errors
        per_call = 1000.0 / max(1, len(p.lat))
        detail = {"load": {
            "sessions": sessions, "concurrency": conc, "rounds": cfg.load_rounds, "calls": len(p.lat),
            "errors": errors,
            "proxy_calls_per_s": round(len(p.lat) / p.wall_s, 1), "engine_calls_per_s": round(len(d.lat) / d.wall_s, 1),
            "proxy_p50_ms": round(_pct(p.lat, 50), 2), "proxy_p99_ms": round(_pct(p.lat, 99), 2),
            "engine_p50_ms": round(_pct(d.lat, 50), 2), "engine_p99_ms": round(_pct(d.lat, 99), 2),
            "added_p50_ms": round(_pct(p.lat, 50) - _pct(d.lat, 50), 2),
            "added_p99_ms": round(_pct(p.lat, 99) - _pct(d.lat, 99), 2),
            "proxy_own_p50_ms": round(_pct(own, 50), 2), "proxy_own_p99_ms": round(_pct(own, 99), 2),
            "cold_proxy_p50_ms": round(_pct(cold, 50), 2), "cold_proxy_p99_ms": round(_pct(cold, 99), 2),
            "proxy_cpu_ms_per_call": round(p.cpu_s * per_call, 3),
            "proxy_tokenizer_cpu_ms_per_call": round(tok_cpu * per_call, 3),
            "proxy_cpu_ms_per_call_excl_tokenizer": round((p.cpu_s - tok_cpu) * per_call, 3),
            "engine_cpu_ms_per_call": round(d.cpu_s * 1000.0 / max(1, len(d.lat)), 3),
            "driver_cpu_ms_per_call": round(p.driver_s * per_call, 3),
            "direct_driver_cpu_ms_per_call": round(d.driver_s * 1000.0 / max(1, len(d.lat)), 3),
            "sdk": {
                "calls": len(s.lat), "errors": sdk_errors, "proxy_calls_per_s": round(len(s.lat) / s.wall_s, 1),
                "proxy_p50_ms": round(_pct(s.lat, 50), 2), "proxy_p99_ms": round(_pct(s.lat, 99), 2),
                "added_p50_ms": round(_pct(s.lat, 50) - _pct(d.lat, 50), 2),
                "added_p99_ms": round(_pct(s.lat, 99) - _pct(d.lat, 99), 2),
                "proxy_cpu_ms_per_call": round(s.cpu_s * 1000.0 / max(1, len(s.lat)), 3),
                "driver_cpu_ms_per_call": round(s.driver_s * 1000.0 / max(1, len(s.lat)), 3),
            },
        }}
        want = sessions * turns
        return (errors == 0 and len(cold) == want and len(p.lat) == want * cfg.load_rounds
                and len(s.lat) == want), detail
    finally:
        if proxy is not None:
            proxy.stop()
        engine.stop()
