"""``AiohttpTransport``: an ``httpx`` transport that sends over an ``aiohttp`` connection pool.

httpx's own pool (httpcore) scans every pooled connection, with a readability poll each, whenever
a request starts or ends: with many calls in flight to one engine that is most of the Proxy's CPU
per call. aiohttp's pool hands out a free connection in constant time and parses responses in C.
It is one implementation of httpx's transport interface, the engine client's one seam: buffered
and streamed answers alike go through :meth:`AiohttpTransport.handle_async_request`, and the
client above keeps httpx's interface and errors: aiohttp's failures come back as the httpx
exceptions they correspond to (a connect failure as ``ConnectError``, a deadline as
``ReadTimeout`` / ``ConnectTimeout``, a broken answer as ``RemoteProtocolError``), and a response
body is decoded by httpx as before (aiohttp does not decompress).

One aiohttp session per event loop, made on first use in that loop (a client may be built outside
any loop and used from one, or from several ``asyncio.run`` calls one after another).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Mapping

from dressage.proxy.engines.httpx_lean import httpx

__all__ = ["AiohttpTransport", "aiohttp_available"]

try:
    import aiohttp
except ImportError:  # pragma: no cover - the client falls back to httpx's own transport
    aiohttp = None  # type: ignore[assignment]

# Hop-by-hop and framing headers: aiohttp writes its own from the body it sends.
_SKIP = frozenset({b"host", b"content-length", b"transfer-encoding", b"connection"})


def aiohttp_available() -> bool:
    return aiohttp is not None


class _Body(httpx.AsyncByteStream):
    def __init__(self, resp: Any, request: httpx.Request) -> None:
        self._resp, self._request = resp, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            raise AiohttpTransport._failed(exc, self._request) from exc

    async def aclose(self) -> None:
        self._resp.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """``max_connections`` per engine; TCP_NODELAY on every connection (no delayed-ACK wait)."""

    def __init__(self, max_connections: int = 1024) -> None:
        if aiohttp is None:
            raise RuntimeError("AiohttpTransport needs aiohttp installed")
        self.max_connections = int(max_connections)
        self._sessions: dict[asyncio.AbstractEventLoop, Any] = {}

    def _session(self) -> Any:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            for old in [lp for lp in self._sessions if lp.is_closed()]:
                del self._sessions[old]  # its loop is gone: nothing left to close it on
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections,
                                             enable_cleanup_closed=False)
            session = self._sessions[loop] = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent", "Accept-Encoding"),
                timeout=aiohttp.ClientTimeout(total=None),
                # No cookies are kept or sent: the engines set none, and filtering an empty jar for
                # every request was a visible share of the Proxy's CPU per call.
                cookie_jar=aiohttp.DummyCookieJar())
        return session

    @staticmethod
    def _failed(exc: BaseException, request: httpx.Request) -> httpx.TransportError:
        """The httpx exception for an aiohttp failure (or a deadline) while sending ``request``."""
        what = f"{request.method} {request.url}: {type(exc).__name__}: {exc}"
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return httpx.ConnectTimeout(what, request=request)
        if isinstance(exc, asyncio.TimeoutError):
            return httpx.ReadTimeout(what, request=request)
        if isinstance(exc, aiohttp.ClientConnectorError):
            return httpx.ConnectError(what, request=request)
        if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
            return httpx.RemoteProtocolError(what, request=request)
        return httpx.ReadError(what, request=request)

    @staticmethod
    def _timeout(t: Mapping[str, Any]) -> Any:
        return aiohttp.ClientTimeout(total=None, connect=t.get("connect"), sock_read=t.get("read"))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session()
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw
                   if k.lower() not in _SKIP]
        body = await request.aread()
        try:
            resp = await session.request(request.method, str(request.url), data=body or None, headers=headers,
                                         timeout=self._timeout(request.extensions.get("timeout") or {}),
                                         allow_redirects=False, compress=None)
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            raise self._failed(exc, request) from exc
        return httpx.Response(resp.status, headers=resp.raw_headers, stream=_Body(resp, request),
                              extensions={"http_version": b"HTTP/1.1"})

    async def aclose(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        session = self._sessions.pop(loop, None) if loop is not None else None
        if session is not None:
            await session.close()
        # Sessions of other loops cannot be closed from this one; dropping them frees their sockets.
        self._sessions.clear()
