"""``Server-Timing: engine;dur=...`` on the Proxy's buffered answers: the engine's share of a call.

The engine wait is read from a clock that advances 250 ms on every read, so one engine call (read once
on entering the wait, once on leaving it) shows as exactly 250 ms, whatever the machine's speed.
"""

import itertools
import threading
from types import SimpleNamespace

import httpx
import pytest

from dressage.proxy.engines import server_timing

ENGINE = {"mean_response_tokens": 20, "tool_call_rate": 0.0}


def _engine_ms(resp: httpx.Response) -> float:
    name, dur = resp.headers["server-timing"].split(";")
    assert name == "engine" and dur.startswith("dur=")
    return float(dur[4:])


@pytest.fixture
def stepping_clock(monkeypatch):
    ticks, lock = itertools.count(), threading.Lock()

    def perf_counter() -> float:
        with lock:
            return next(ticks) * 0.25

    monkeypatch.setattr(server_timing, "time", SimpleNamespace(perf_counter=perf_counter))


def test_buffered_answers_carry_the_engine_wait_and_streams_do_not(stepping_clock, engine, proxy_stack):
    proxy = proxy_stack(engine.url, r3=False)
    with httpx.Client(base_url=proxy.url, timeout=20) as h:
        sid = h.post("/sessions", json={}).json()["session_id"]
        assert "server-timing" not in h.post("/sessions", json={}).headers
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
        chat = h.post(f"/sessions/{sid}/v1/chat/completions", json=body)
        assert chat.status_code == 200 and _engine_ms(chat) == 250.0   # one engine call, timed once
        gen = h.post(f"/sessions/{sid}/generate",
                     json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 5}})
        assert gen.status_code == 200 and _engine_ms(gen) == 250.0
        with h.stream("POST", f"/sessions/{sid}/v1/chat/completions", json={**body, "stream": True}) as s:
            assert s.status_code == 200 and "server-timing" not in s.headers
            s.read()
