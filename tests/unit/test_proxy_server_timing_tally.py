"""The engine wait of a request counts overlapping engine calls once and sequential ones in sum."""

import asyncio
import time

from dressage.proxy.engines import server_timing


async def _call(seconds: float) -> None:
    with server_timing.engine_wait():
        await asyncio.sleep(seconds)


def test_parallel_calls_count_once_and_calls_in_turn_add_up():
    async def go():
        tally = server_timing.start()
        await asyncio.gather(_call(0.2), _call(0.2), _call(0.2))   # n = 3 samples at once
        parallel = tally.seconds
        await _call(0.1)                                          # then a resumed generation
        await _call(0.1)
        return parallel, tally.seconds

    parallel, total = asyncio.run(go())
    assert 0.19 <= parallel < 0.4          # once, not three times
    assert parallel + 0.19 <= total < parallel + 0.4
    assert server_timing.header_value(server_timing.Tally()) == "engine;dur=0.000"


def test_no_tally_outside_a_served_request():
    async def go():
        t0 = time.perf_counter()
        await _call(0.01)  # nothing started: a no-op
        return time.perf_counter() - t0

    assert asyncio.run(go()) >= 0.01
