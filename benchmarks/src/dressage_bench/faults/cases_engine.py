"""Engine faults mid-session: the engine dies, or stops answering in time."""

from __future__ import annotations

from typing import Any

import httpx

from dressage_bench.faults._stack import free_port, start_engine, start_proxy
from dressage_bench.faults.runner import FaultsConfig, case

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
