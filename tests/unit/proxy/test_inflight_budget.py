"""The Proxy's in-flight byte budget: calls past it wait their turn, in order, and one still waiting at
its deadline gets a typed 503 with nothing sent to the engine."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from dressage.errors import ConfigError, ProxyOverloadedError
from dressage.proxy.config import LimitsConfig
from dressage.proxy.engines.inflight import TOKEN_BYTES, InflightBudget, answer_bytes


def test_an_answer_is_estimated_from_its_tokens_and_routing_shape():
    assert answer_bytes(10, None) == 10 * TOKEN_BYTES
    # 40 layers x top-8 int32 is 1,280 bytes a token, 1,708 in base64 (padded to 4).
    assert answer_bytes(10, (40, 8)) == 10 * (1708 + TOKEN_BYTES)


def test_calls_past_the_budget_wait_in_order_and_hold_at_most_it():
    async def main():
        budget = InflightBudget(100, wait_s=30)
        order, release = [], {i: asyncio.Event() for i in range(4)}

        async def call(i, nbytes):
            async with budget.hold(nbytes):
                order.append(i)
                assert budget.held <= budget.limit
                await release[i].wait()

        tasks = [asyncio.create_task(call(0, 60))]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(call(1, 60)), asyncio.create_task(call(2, 30)), asyncio.create_task(call(3, 10))]
        for _ in range(5):
            await asyncio.sleep(0)
        # 2 and 3 would fit beside 0, but 1 came first: nobody passes a waiting call.
        assert order == [0] and budget.held == 60 and budget.calls == 1
        release[0].set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert order == [0, 1, 2, 3] and budget.held == 100
        for e in release.values():
            e.set()
        await asyncio.gather(*tasks)
        assert budget.held == 0 and budget.calls == 0 and budget.peak == 100

    asyncio.run(main())


def test_a_call_larger_than_the_budget_runs_alone():
    async def main():
        budget = InflightBudget(100, wait_s=30)
        async with budget.hold(500):
            assert budget.held == 500 and budget.calls == 1
        async with budget.hold(10):
            pass
        assert budget.held == 0

    asyncio.run(main())


def test_a_call_still_waiting_at_its_deadline_is_refused_and_leaves_the_line():
    async def main():
        budget = InflightBudget(100, wait_s=0.05)
        hold = asyncio.Event()

        async def long_call():
            async with budget.hold(100):
                await hold.wait()

        first = asyncio.create_task(long_call())
        await asyncio.sleep(0)
        with pytest.raises(ProxyOverloadedError, match="in-flight budget"):
            async with budget.hold(1):
                raise AssertionError("admitted past the budget")
        assert budget.refused == 1 and not budget._waiters and budget.held == 100
        hold.set()
        await first
        async with budget.hold(1):  # the refused call left nothing behind
            assert budget.held == 1

    asyncio.run(main())


def test_config_checks_the_budget_fields():
    assert LimitsConfig().inflight_bytes is None
    with pytest.raises(ConfigError, match="inflight_bytes"):
        LimitsConfig(inflight_bytes=0)
    with pytest.raises(ConfigError, match="inflight_wait_s"):
        LimitsConfig(inflight_wait_s=0)


def test_over_http_a_call_without_room_gets_a_503_naming_the_budget(engine, proxy_stack):
    proxy = proxy_stack(engine.url, inflight_bytes=1 << 20, inflight_wait_s=0.2)
    budget = proxy.service.chat.calls.answer_budget
    sid = httpx.post(proxy.url + "/sessions", timeout=20).json()["session_id"]
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    url = f"{proxy.url}/sessions/{sid}/v1/chat/completions"
    budget.held, budget.calls = budget.limit, 1  # another call holds the whole budget
    try:
        r = httpx.post(url, json=body, timeout=30)
    finally:
        budget.held, budget.calls = 0, 0
    assert r.status_code == 503, r.text
    assert "proxy_overloaded" in r.text and budget.refused == 1
    assert proxy.core.session(sid).steps == {}  # nothing was sent or recorded
    r = httpx.post(url, json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert budget.held == 0 and 0 < budget.peak <= budget.limit
