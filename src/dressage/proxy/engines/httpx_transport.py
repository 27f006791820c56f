"""``HttpxTransport``: the engine transport over any httpx transport (httpx's own pool, ``httpx.MockTransport``).

The fallback where aiohttp is not installed, and the way tests put a mock engine behind the client.
httpx's exceptions come back as :class:`~.transport.EngineTransportError` named after them.
"""

from __future__ import annotations

import contextlib
from typing import AsyncIterator, Iterator, Mapping

from dressage.proxy.engines.httpx_lean import httpx
from dressage.proxy.engines.transport import EngineResponse, EngineTransportError, EngineTransportTimeout

__all__ = ["HttpxTransport"]


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """httpx's transport failures inside the block as :class:`EngineTransportError`, named after them."""
    try:
        yield
    except httpx.TransportError as exc:
        kind = EngineTransportTimeout if isinstance(exc, httpx.TimeoutException) else EngineTransportError
        raise kind(type(exc).__name__, str(exc)) from exc


class _Response(EngineResponse):
    __slots__ = ("_resp",)

    def __init__(self, resp: httpx.Response) -> None:
        super().__init__(resp.status_code, resp.headers)
        self._resp = resp

    async def pieces(self) -> AsyncIterator[bytes]:
        with _translated():
            async for piece in self._resp.aiter_bytes():
                yield piece

    async def aclose(self) -> None:
        await self._resp.aclose()


class HttpxTransport:
    """An :class:`~.transport.EngineTransport` that sends through ``transport``."""
    # method docstrings inherited from EngineTransport

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self.transport = transport

    async def send(self, method: str, url: str, *, body: bytes | None, headers: Mapping[str, str],
                   timeout: float) -> EngineResponse:
        request = httpx.Request(method, url, headers=headers, content=body,
                                extensions={"timeout": {"connect": timeout, "read": timeout,
                                                        "write": timeout, "pool": timeout}})
        with _translated():
            resp = await self.transport.handle_async_request(request)
        resp.request = request
        return _Response(resp)

    async def aclose(self) -> None:
        await self.transport.aclose()
