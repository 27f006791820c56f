"""``HttpxTransport``: the engine transport over any httpx transport (httpx's own pool, ``httpx.MockTransport``).

The fallback where aiohttp is not installed, and the way tests put a mock engine behind the client.
httpx's exceptions come back as :class:`~.transport.EngineTransportError` named after them.
"""

from __future__ import annotations

from typing import AsyncIterator, Mapping

from dressage.proxy.engines.httpx_lean import httpx
from dressage.proxy.engines.transport import EngineResponse, EngineTransportError, EngineTransportTimeout

__all__ = ["HttpxTransport"]


def _failed(exc: httpx.TransportError) -> EngineTransportError:
    kind = EngineTransportTimeout if isinstance(exc, httpx.TimeoutException) else EngineTransportError
    return kind(type(exc).__name__, str(exc))


class _Response(EngineResponse):
    __slots__ = ("_resp",)

    def __init__(self, resp: httpx.Response) -> None:
        super().__init__(resp.status_code, resp.headers)
        self._resp = resp

    async def read(self) -> bytes:
        try:
            return await self._resp.aread()
        except httpx.TransportError as exc:
            raise _failed(exc) from exc

    async def pieces(self) -> AsyncIterator[bytes]:
        try:
            async for piece in self._resp.aiter_bytes():
                yield piece
        except httpx.TransportError as exc:
            raise _failed(exc) from exc

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
        try:
            resp = await self.transport.handle_async_request(request)
        except httpx.TransportError as exc:
            raise _failed(exc) from exc
        resp.request = request
        return _Response(resp)

    async def aclose(self) -> None:
        await self.transport.aclose()
