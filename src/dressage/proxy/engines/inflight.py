"""The Proxy's in-flight byte budget: how many bytes of engine answers its calls may hold at once.

Each call reserves an estimate of its answer before its engine request (:func:`answer_bytes`: every
token it may hold, prompt and reply, times what a token's fields take in the answer) and gives it back
when the call ends, so K concurrent long calls hold at most the budget rather than K answers. A call past
the budget waits its turn (first come, first served); one still waiting after ``wait_s`` gets
:class:`~dressage.errors.ProxyOverloadedError` (503), and nothing of it was sent. A call larger than the
whole budget is admitted alone, once nothing else is in flight.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from dressage.errors import ProxyOverloadedError

__all__ = ["InflightBudget", "answer_bytes", "TOKEN_BYTES"]

TOKEN_BYTES = 64  # an output token's id, logprob entry and text in the answer's JSON, generously


def answer_bytes(tokens: int, r3_shape: tuple[int, int] | None) -> int:
    """What an answer of ``tokens`` tokens may take: base64 int32 routing per token (layers x top-k)
    plus the per-token JSON."""
    routing = 0 if r3_shape is None else -(-r3_shape[0] * r3_shape[1] * 4 // 3) * 4
    return max(1, int(tokens)) * (routing + TOKEN_BYTES)


class InflightBudget:
    """``async with budget.hold(n):`` admits a call of ``n`` bytes once the budget has room for it."""

    def __init__(self, limit_bytes: int, *, wait_s: float) -> None:
        self.limit = int(limit_bytes)
        self.wait_s = float(wait_s)
        self.held = 0
        self.calls = 0
        self.peak = 0
        self.refused = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _fits(self, nbytes: int) -> bool:
        return self.held + nbytes <= self.limit or self.calls == 0

    @asynccontextmanager
    async def hold(self, nbytes: int) -> AsyncIterator[None]:
        nbytes = max(0, int(nbytes))
        if self._waiters or not self._fits(nbytes):
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (nbytes, turn)
            self._waiters.append(entry)
            try:
                await asyncio.wait_for(asyncio.shield(turn), self.wait_s)
            except asyncio.TimeoutError:
                self._leave(entry, turn)
                self.refused += 1
                raise ProxyOverloadedError(
                    f"the Proxy's in-flight budget ({self.limit} bytes, {self.held} held by {self.calls} "
                    f"call(s)) had no room for this call's {nbytes} bytes within {self.wait_s:g} s") from None
            except BaseException:
                self._leave(entry, turn)
                raise
        else:
            self._take(nbytes)
        try:
            yield
        finally:
            self.held -= nbytes
            self.calls -= 1
            self._wake()

    def _take(self, nbytes: int) -> None:
        self.held += nbytes
        self.calls += 1
        self.peak = max(self.peak, self.held)

    def _leave(self, entry: tuple[int, "asyncio.Future[None]"], turn: "asyncio.Future[None]") -> None:
        """A waiter that gives up: out of the line, or, admitted meanwhile, its bytes given back."""
        if turn.done() and not turn.cancelled():
            self.held -= entry[0]
            self.calls -= 1
        else:
            turn.cancel()
            try:
                self._waiters.remove(entry)
            except ValueError:
                pass
        self._wake()

    def _wake(self) -> None:
        """Admit waiters in order while the first fits."""
        while self._waiters and self._fits(self._waiters[0][0]):
            nbytes, turn = self._waiters.popleft()
            if turn.done():
                continue
            self._take(nbytes)
            turn.set_result(None)
