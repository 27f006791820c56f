"""``Server-Timing: engine;dur=...`` on the Proxy's buffered answers: the engine's share of a call."""

import time

import httpx

from dressage.engine.config import EngineConfig
from dressage.engine.server import EngineServer
from dressage.fields import get_model
from dressage.dataplane import DataPlaneConfig
from dressage.proxy import Proxy
from dressage.proxy.config import EnginesConfig, ProxyConfig

MODEL = get_model("tiny-moe")


def _engine_ms(resp: httpx.Response) -> float:
    name, dur = resp.headers["server-timing"].split(";")
    assert name == "engine" and dur.startswith("dur=")
    return float(dur[4:])


def test_buffered_answers_carry_the_engine_wait_and_streams_do_not():
    # 20 tokens at 10 ms each: the engine takes at least 200 ms for every call.
    engine = EngineServer(EngineConfig(model=MODEL, port=0, seed=3, mean_response_tokens=20, token_delay_s=0.01,
                                       tool_call_rate=0.0))
    engine.start_background()
    proxy = Proxy.start(ProxyConfig(data_plane=DataPlaneConfig(model=MODEL),
                                    engines=EnginesConfig(engine_urls=(engine.url,), request_timeout_s=20)))
    try:
        with httpx.Client(base_url=proxy.url, timeout=20) as h:
            sid = h.post("/sessions", json={}).json()["session_id"]
            assert "server-timing" not in h.post("/sessions", json={}).headers
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
            t0 = time.perf_counter()
            chat = h.post(f"/sessions/{sid}/v1/chat/completions", json=body)
            took_ms = (time.perf_counter() - t0) * 1000.0
            assert chat.status_code == 200
            tokens = chat.json()["usage"]["completion_tokens"]
            assert tokens * 10.0 * 0.9 <= _engine_ms(chat) <= took_ms
            gen = h.post(f"/sessions/{sid}/generate",
                         json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 5}})
            assert gen.status_code == 200 and 5 * 10.0 * 0.9 <= _engine_ms(gen)
            with h.stream("POST", f"/sessions/{sid}/v1/chat/completions", json={**body, "stream": True}) as s:
                assert s.status_code == 200 and "server-timing" not in s.headers
                s.read()
    finally:
        proxy.shutdown()
        engine.stop()
