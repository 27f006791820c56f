"""Load: many concurrent agent sessions against one Proxy, and the same calls straight to the engine.

Throughput is model calls per second; the Proxy's added latency is its per-call latency minus the
engine's for the same prompts, measured in the same run at the same concurrency. The Proxy's own
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
from typing import Any

import httpx
import numpy as np
import openai
import psutil

from dressage_bench.faults._stack import serve_process
from dressage_bench.faults.runner import FaultsConfig, case
from dressage.proxy import fastjson
from dressage.proxy.aio_transport import AiohttpTransport
from dressage.proxy.sglang_client import SGLangClient
from dressage.tokenizer import load_tokenizer


def _cpu_s(served: Any) -> float:
    t = psutil.Process(served.proc.pid).cpu_times()
    return float(t.user + t.system)


def _tokenizer_cpu_s(served: Any) -> float:
    """The CPU time the Proxy's tokenizer calls took, as the Proxy measured it (``/trajectory/stats``)."""
    return float(httpx.get(served.url + "/trajectory/stats", timeout=30).json()["tokenizer_cpu_s"])


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) * 1000.0 if xs else float("nan")


def _engine_wait_s(server_timing: str) -> float:
    """The ``engine;dur=<ms>`` entry of the Proxy's ``Server-Timing`` header, in seconds."""
    for entry in server_timing.split(","):
        name, _, dur = entry.strip().partition(";dur=")
        if name == "engine":
            return float(dur) / 1000.0
    raise RuntimeError(f"no engine entry in Server-Timing {server_timing!r}")


async def _through_proxy_lean(url: str, sessions: int, turns: int, concurrency: int,
                              own: list[float]) -> tuple[list[float], list, int]:
    """The agents' calls as plain JSON posts on the aiohttp pool the direct run's engine client uses;
    ``own`` gets each call's latency less the engine wait the Proxy reports for it."""
    lat: list[float] = []
    prompts: list = []
    errors = 0
    gate = asyncio.Semaphore(concurrency)
    pool = AiohttpTransport(concurrency)
    headers = {"content-type": "application/json"}

    async def post(path: str, body: dict) -> Any:
        resp = await pool.send("POST", url + path, content=fastjson.dumps(body), headers=headers, timeout_s=120)
        return resp, fastjson.loads(resp.content)

    async def one(i: int) -> None:
        nonlocal errors
        async with gate:
            sid = (await post("/sessions", {"metadata": {"group_index": i}}))[1]["session_id"]
            msgs = [{"role": "user", "content": f"Session {i}: list some primes."}]
            for _ in range(turns):
                t0 = time.perf_counter()
                prompts.append(list(msgs))
                resp, reply = await post(f"/sessions/{sid}/v1/chat/completions",
                                         {"model": "m", "messages": msgs, "max_tokens": 32})
                if resp.status_code != 200:
                    errors += 1
                    return
                lat.append(time.perf_counter() - t0)
                own.append(lat[-1] - _engine_wait_s(resp.headers.get("server-timing", "")))
                message = {k: v for k, v in reply["choices"][0]["message"].items() if v is not None}
                msgs = msgs + [message, {"role": "user", "content": "More."}]
            await post(f"/sessions/{sid}/finalize", {"reward": 1.0})
    try:
        await asyncio.gather(*(one(i) for i in range(sessions)))
    finally:
        await pool.aclose()
    return lat, prompts, errors


async def _through_proxy(url: str, sessions: int, turns: int, concurrency: int) -> tuple[list[float], list, int]:
    """The same calls through the openai SDK, as agent frameworks make them."""
    lat: list[float] = []
    prompts: list = []  # the messages of every call, rendered later for the direct run
    errors = 0
    gate = asyncio.Semaphore(concurrency)
    # The agents' client rides the same connection pool as the Proxy's engine client (and the direct
    # run's), so the added latency is the Proxy's, not a difference between HTTP client pools.
    async with httpx.AsyncClient(timeout=120, transport=AiohttpTransport(concurrency)) as h:
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


async def _direct(engine_url: str, prompts: list[list[int]], concurrency: int) -> list[float]:
    lat: list[float] = []
    gate = asyncio.Semaphore(concurrency)
    async with SGLangClient(engine_url, timeout=120) as client:
        async def one(ids: list[int]) -> None:
            async with gate:
                t0 = time.perf_counter()
                await client.generate(ids, {"max_new_tokens": 32}, return_logprob=True, return_routed_experts=True)
                lat.append(time.perf_counter() - t0)
        await asyncio.gather(*(one(p) for p in prompts))
    return lat


@case("load")
def load(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    # Engine and Proxy in their own processes, as deployed: the driver's work does not share their GIL.
    engine = serve_process(["engine", "serve", "--model", "qwen3.6-35b-a3b", "--mean-response-tokens", "24",
                            "--seed", str(cfg.seed)])
    proxy = None
    conc = cfg.load_sessions
    try:
        proxy = serve_process(["proxy", "serve", "--engine-url", engine.url,
                               "--use-rollout-routing-replay", "--enable-transfer-queue",
                               "--routed-experts-dtype", "uint8"])
        tok0 = _tokenizer_cpu_s(proxy)
        t0, cpu0, drv0 = time.perf_counter(), _cpu_s(proxy), time.process_time()
        own: list[float] = []
        lat_p, messages, errors = asyncio.run(_through_proxy_lean(proxy.url, cfg.load_sessions, cfg.load_turns, conc,
                                                                  own))
        wall_p, proxy_cpu, drv_p = time.perf_counter() - t0, _cpu_s(proxy) - cpu0, time.process_time() - drv0
        tok_cpu = _tokenizer_cpu_s(proxy) - tok0
        per_call = 1000.0 / max(1, len(lat_p))
        tok = load_tokenizer("byte")
        prompts = [tok.apply_chat_template(m, None, True) for m in messages]
        t0, cpu0, drv0 = time.perf_counter(), _cpu_s(engine), time.process_time()
        lat_d = asyncio.run(_direct(engine.url, prompts, conc))
        wall_d, engine_cpu, drv_d = time.perf_counter() - t0, _cpu_s(engine) - cpu0, time.process_time() - drv0
        t0, cpu0, drv0 = time.perf_counter(), _cpu_s(proxy), time.process_time()
        lat_s, _, sdk_errors = asyncio.run(_through_proxy(proxy.url, cfg.load_sessions, cfg.load_turns, conc))
        wall_s, sdk_proxy_cpu, drv_s = time.perf_counter() - t0, _cpu_s(proxy) - cpu0, time.process_time() - drv0
        errors += sdk_errors
        detail = {"load": {
            "sessions": cfg.load_sessions, "concurrency": conc, "calls": len(lat_p), "errors": errors,
            "proxy_calls_per_s": round(len(lat_p) / wall_p, 1), "engine_calls_per_s": round(len(lat_d) / wall_d, 1),
            "proxy_p50_ms": round(_pct(lat_p, 50), 2), "proxy_p99_ms": round(_pct(lat_p, 99), 2),
            "engine_p50_ms": round(_pct(lat_d, 50), 2), "engine_p99_ms": round(_pct(lat_d, 99), 2),
            "added_p50_ms": round(_pct(lat_p, 50) - _pct(lat_d, 50), 2),
            "added_p99_ms": round(_pct(lat_p, 99) - _pct(lat_d, 99), 2),
            "proxy_own_p50_ms": round(_pct(own, 50), 2), "proxy_own_p99_ms": round(_pct(own, 99), 2),
            "proxy_cpu_ms_per_call": round(proxy_cpu * per_call, 3),
            "proxy_tokenizer_cpu_ms_per_call": round(tok_cpu * per_call, 3),
            "proxy_cpu_ms_per_call_excl_tokenizer": round((proxy_cpu - tok_cpu) * per_call, 3),
            "engine_cpu_ms_per_call": round(engine_cpu * 1000.0 / max(1, len(lat_d)), 3),
            "driver_cpu_ms_per_call": round(drv_p * per_call, 3),
            "direct_driver_cpu_ms_per_call": round(drv_d * 1000.0 / max(1, len(lat_d)), 3),
            "sdk": {
                "calls": len(lat_s), "errors": sdk_errors, "proxy_calls_per_s": round(len(lat_s) / wall_s, 1),
                "proxy_p50_ms": round(_pct(lat_s, 50), 2), "proxy_p99_ms": round(_pct(lat_s, 99), 2),
                "added_p50_ms": round(_pct(lat_s, 50) - _pct(lat_d, 50), 2),
                "added_p99_ms": round(_pct(lat_s, 99) - _pct(lat_d, 99), 2),
                "proxy_cpu_ms_per_call": round(sdk_proxy_cpu * 1000.0 / max(1, len(lat_s)), 3),
                "driver_cpu_ms_per_call": round(drv_s * 1000.0 / max(1, len(lat_s)), 3),
            },
        }}
        want = cfg.load_sessions * cfg.load_turns
        return errors == 0 and len(lat_p) == want and len(lat_s) == want, detail
    finally:
        if proxy is not None:
            proxy.stop()
        engine.stop()
