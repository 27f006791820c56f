"""A model call whose client hangs up before its answer: cancelled, as a stream is when its reader goes away.

Every route that answers a model call (chat, ``/generate``, Responses, text completions, Anthropic
Messages; the hot routes of :mod:`dressage.proxy.http.fast_routes` and the FastAPI app's alike) awaits
its answer through :func:`unless_gone`, once the request's body was read. A call whose recording already
began is recorded whole (:class:`dressage.proxy.recording.lifecycle.CallInFlight`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, TypeVar

from starlette.responses import Response

from dressage.errors import DressageError

__all__ = ["unless_gone", "HungUp"]

Receive = Callable[[], Awaitable[dict[str, Any]]]
T = TypeVar("T")


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_gone(answer: Awaitable[T], receive: Receive) -> T | None:
    """``answer``'s value, or ``None`` when the client hung up first: the answer is then cancelled (the engine
    request aborted, nothing recorded; a reply already being recorded is recorded whole). A stream is returned
    as soon as it opens; from then on the stream watches its reader itself.

    ``receive`` is the request's ASGI receive after its body was read: what it gives next is the disconnect.
    """
    work = asyncio.ensure_future(answer)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request itself is cancelled (the server stopping)
        work.cancel()
        gone.cancel()
        raise
    if work.done():
        gone.cancel()
        return work.result()
    work.cancel()
    try:
        await work
    except (asyncio.CancelledError, DressageError):
        pass
    return None


class HungUp(Response):
    """What a FastAPI route returns when :func:`unless_gone` found its client gone: nothing is sent, there is
    no one to read it."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        return None
