"""The engine wait of a request counts overlapping engine calls once and sequential ones in sum.

The tally reads its clock through ``server_timing.time``; the tests swap in a clock they set by hand,
so every expected value is exact.
"""

import asyncio
from types import SimpleNamespace

import pytest

from dressage.proxy.engines import server_timing


class _Clock:
    def __init__(self) -> None:
        self.now, self.reads = 0.0, 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setattr(server_timing, "time", SimpleNamespace(perf_counter=c))
    return c


def test_parallel_calls_count_once_and_calls_in_turn_add_up(clock):
    async def go():
        tally = server_timing.start()
        release = asyncio.Event()

        async def call():
            with server_timing.engine_wait():
                await release.wait()

        clock.now = 10.0
        calls = [asyncio.create_task(call()) for _ in range(3)]   # n = 3 samples at once
        await asyncio.sleep(0)                                     # all three wait on the engine
        clock.now = 10.2
        release.set()
        await asyncio.gather(*calls)
        parallel = tally.seconds
        for start, end in ((11.0, 11.1), (12.0, 12.1)):            # then a resumed generation: in turn
            clock.now = start
            with server_timing.engine_wait():
                clock.now = end
        return parallel, tally.seconds

    parallel, total = asyncio.run(go())
    assert parallel == pytest.approx(0.2)          # once, not three times
    assert total == pytest.approx(0.2 + 0.1 + 0.1)
    assert server_timing.header_value(server_timing.Tally()) == "engine;dur=0.000"


def test_no_tally_outside_a_served_request(clock):
    async def go():
        with server_timing.engine_wait():   # nothing started: a no-op
            clock.now = 5.0
        return server_timing.start().seconds

    assert asyncio.run(go()) == 0.0 and clock.reads == 0
