"""Engine faults mid-session: the engine dies, stops answering in time, sends only keep-alives, or
answers without end (a declared 2 GiB body, a 2 GiB chunked one, a streamed line that never ends)."""

from __future__ import annotations

import resource
import time
from typing import Any

import httpx

from dressage_bench.faults._stack import free_port, start_engine, start_proxy
from dressage_bench.faults.hostile import HUGE_BYTES, HostileEngine
from dressage_bench.faults.runner import FaultsConfig, case

CAP = 16 * 1024 * 1024
"""The Proxy's cap on one engine answer in the unbounded-answer case."""

MSG_SHORT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three rivers."}]


def _chat(url: str, sid: str, messages, timeout: float = 30.0) -> httpx.Response:
    return httpx.post(f"{url}/sessions/{sid}/v1/chat/completions", json={"messages": messages, "max_tokens": 24},
                      timeout=timeout)


def _steps(url: str, sid: str) -> int:
    return httpx.get(f"{url}/sessions/{sid}").json()["steps"]


@case("engine_down_mid_session")
def engine_down(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    port = free_port()
    engine = start_engine(port)
    stack = start_proxy(engine.url, timeout_s=10)
    try:
        sid = httpx.post(stack.url + "/sessions").json()["session_id"]
        first = _chat(stack.url, sid, MSGS)
        msgs = MSGS + [first.json()["choices"][0]["message"], {"role": "user", "content": "And two more."}]
        engine.stop()                                         # the engine dies between two turns
        down = _chat(stack.url, sid, msgs)
        steps_while_down = _steps(stack.url, sid)
        engine = start_engine(port)                           # it comes back on the same address
        again = _chat(stack.url, sid, msgs)
        fin = httpx.post(f"{stack.url}/sessions/{sid}/finalize", json={"reward": 1.0}).json()
        detail = {"status_while_down": down.status_code, "error_type": down.json()["error"]["type"],
                  "steps_after_failed_call": steps_while_down, "status_after_restart": again.status_code,
                  "segments": fin["segments"]}
        passed = (first.status_code == 200 and down.status_code == 502 and steps_while_down == 1
                  and again.status_code == 200 and fin["segments"] == 1)
        return passed, detail
    finally:
        stack.stop()
        engine.stop()


@case("engine_timeout_mid_session")
def engine_timeout(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    engine = start_engine(token_delay_s=0.2)                  # 24 tokens take ~5 s; the Proxy allows 1 s
    stack = start_proxy(engine.url, timeout_s=1.0)
    try:
        sid = httpx.post(stack.url + "/sessions").json()["session_id"]
        r = _chat(stack.url, sid, MSGS)
        steps = _steps(stack.url, sid)
        health = httpx.get(stack.url + "/health").status_code
        detail = {"status": r.status_code, "error_type": r.json().get("error", {}).get("type"),
                  "steps_recorded": steps, "proxy_health": health}
        return r.status_code == 504 and steps == 0 and health == 200, detail
    finally:
        stack.stop()
        engine.stop()


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _hostile_stack(timeout_s: float, **kw: Any):
    engine = HostileEngine()
    engine.start_background()
    return engine, start_proxy(engine.url, timeout_s=timeout_s, r3=False, skip_engine_check=True, **kw)


@case("engine_keepalive_stream")
def engine_keepalive_stream(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    """An engine that answers a streamed call with keep-alive lines only (every 50 ms) is cut by the
    Proxy's request timeout (1 s) with a 504; nothing is recorded, and the next call works."""
    engine, stack = _hostile_stack(1.0)
    try:
        sid = httpx.post(stack.url + "/sessions").json()["session_id"]
        engine.mode = "stream_keepalive"
        detail: dict[str, Any] = {}
        ok = True
        for stream in (True, False):
            t0 = time.perf_counter()
            r = httpx.post(f"{stack.url}/sessions/{sid}/v1/chat/completions", json={**MSG_SHORT, "stream": stream},
                           timeout=60)
            what = "streamed" if stream else "plain"
            detail[f"{what}_status"] = r.status_code
            detail[f"{what}_cut_after_s"] = round(time.perf_counter() - t0, 2)
            ok = ok and r.status_code == 504
        engine.mode = "ok"
        after = httpx.post(f"{stack.url}/sessions/{sid}/v1/chat/completions", json=MSG_SHORT, timeout=30)
        detail.update(keepalive_calls=engine.calls - 1, steps_recorded=_steps(stack.url, sid),
                      valid_call_after=after.status_code)
        return ok and after.status_code == 200 and detail["steps_recorded"] == 1, detail
    finally:
        stack.stop()
        engine.stop()


@case("engine_huge_answer")
def engine_huge_answer(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    """Answers of 2 GiB (declared, chunked without a length, one streamed line) against a 16 MiB cap:
    each is a 502 ``engine_answer_too_large``, nothing is recorded, and the Proxy's memory grows by
    less than 4x the cap, not by what the engine declares."""
    engine, stack = _hostile_stack(30.0, max_answer_bytes=CAP)
    try:
        sid = httpx.post(stack.url + "/sessions").json()["session_id"]
        before = _rss_mib()
        answers, bad = {}, []
        for mode, stream in (("huge_declared", False), ("huge_chunked", False), ("stream_huge_line", True)):
            engine.mode = mode
            r = httpx.post(f"{stack.url}/sessions/{sid}/v1/chat/completions", json={**MSG_SHORT, "stream": stream},
                           timeout=60)
            code = r.json().get("error", {}).get("code") if r.headers.get("content-type") == "application/json" \
                else None
            answers[mode] = f"{r.status_code} {code}"
            if r.status_code != 502 or code != "engine_answer_too_large":
                bad.append(f"{mode}: {r.status_code} {r.text[:120]}")
        grown = _rss_mib() - before
        steps = _steps(stack.url, sid)
        detail = {"declared_mib": HUGE_BYTES >> 20, "cap_mib": CAP >> 20, "answers": answers,
                  "rss_growth_mib": round(grown, 1), "steps_recorded": steps, "wrong": bad}
        return not bad and steps == 0 and grown < 4 * (CAP >> 20), detail
    finally:
        stack.stop()
        engine.stop()
