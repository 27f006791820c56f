"""``AiohttpTransport``: the engine transport over an aiohttp connection pool, the Proxy's default.

httpx's own pool (httpcore) scans every pooled connection, with a readability poll each, whenever
a request starts or ends: with many calls in flight to one engine that is most of the Proxy's CPU
per call. aiohttp's pool hands out a free connection in constant time and parses responses in C,
and it is used as it is: no httpx request or response objects per call. aiohttp's failures come
back as :class:`~.transport.EngineTransportError` named as httpx names them (a connect failure
``ConnectError``, a deadline ``ReadTimeout`` / ``ConnectTimeout``, a broken answer ``RemoteProtocolError``).

One aiohttp session per event loop, made on first use in that loop (a client may be built outside
any loop and used from one, or from several ``asyncio.run`` calls one after another).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Iterator, Mapping

from dressage.proxy.engines.transport import (EngineAnswerTooLarge, EngineResponse, EngineTransportError,
                                              EngineTransportTimeout)

__all__ = ["AiohttpTransport", "aiohttp_available"]

try:
    import aiohttp
except ImportError:  # pragma: no cover - the client falls back to httpx's own transport
    aiohttp = None  # type: ignore[assignment]


def aiohttp_available() -> bool:
    return aiohttp is not None


def _failed(exc: BaseException, method: str, url: str) -> EngineTransportError:
    """The transport error for an aiohttp failure (or a deadline) while sending ``method url``."""
    what = f"{method} {url}: {type(exc).__name__}: {exc}"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return EngineTransportTimeout("ConnectTimeout", what)
    if isinstance(exc, asyncio.TimeoutError):
        return EngineTransportTimeout("ReadTimeout", what)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return EngineTransportError("ConnectError", what)
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return EngineTransportError("RemoteProtocolError", what)
    return EngineTransportError("ReadError", what)


@contextlib.contextmanager
def _translated(method: str, url: str) -> Iterator[None]:
    """aiohttp's failures (and deadlines) inside the block as :class:`EngineTransportError`."""
    try:
        yield
    except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
        raise _failed(exc, method, url) from exc


class _Response(EngineResponse):
    __slots__ = ("_resp", "_method", "_url")

    def __init__(self, resp: Any, method: str, url: str) -> None:
        super().__init__(resp.status, resp.headers)
        self._resp, self._method, self._url = resp, method, url

    async def pieces(self) -> AsyncIterator[bytes]:
        with _translated(self._method, self._url):
            async for piece in self._resp.content.iter_any():
                yield piece

    async def feed(self, sink: Any, limit: int | None = None) -> None:
        # The same as the default, without an async generator between aiohttp's stream and the sink.
        self.check_declared(limit)
        size = 0
        with _translated(self._method, self._url):
            async for piece in self._resp.content.iter_any():
                size += len(piece)
                if limit is not None and size > limit:
                    raise EngineAnswerTooLarge(f"the answer is over the cap of {limit} bytes", limit)
                sink.feed(piece)

    async def aclose(self) -> None:
        self._resp.release()


class AiohttpTransport:
    """An :class:`~.transport.EngineTransport` with ``max_connections`` per engine; TCP_NODELAY on every
    connection (no delayed-ACK wait)."""
    # method docstrings inherited from EngineTransport

    def __init__(self, max_connections: int = 1024) -> None:
        if aiohttp is None:
            raise RuntimeError("AiohttpTransport needs aiohttp installed")
        self.max_connections = int(max_connections)
        self._sessions: dict[asyncio.AbstractEventLoop, Any] = {}
        self._timeouts: dict[float, Any] = {}

    def _session(self) -> Any:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            for old in [lp for lp in self._sessions if lp.is_closed()]:
                del self._sessions[old]  # its loop is gone: nothing left to close it on
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections,
                                             enable_cleanup_closed=False)
            session = self._sessions[loop] = aiohttp.ClientSession(
                connector=connector, skip_auto_headers=("User-Agent", "Accept-Encoding"),
                timeout=aiohttp.ClientTimeout(total=None),
                # No cookies are kept or sent: the engines set none, and filtering an empty jar for
                # every request was a visible share of the Proxy's CPU per call.
                cookie_jar=aiohttp.DummyCookieJar())
        return session

    def _timeout(self, seconds: float) -> Any:
        t = self._timeouts.get(seconds)
        if t is None:
            if len(self._timeouts) > 64:  # deadlines that vary call by call: keep only recent ones
                self._timeouts.clear()
            t = self._timeouts[seconds] = aiohttp.ClientTimeout(total=None, connect=seconds, sock_read=seconds)
        return t

    async def send(self, method: str, url: str, *, body: bytes | None, headers: Mapping[str, str],
                   timeout: float) -> EngineResponse:
        session = self._session()
        with _translated(method, url):
            resp = await session.request(method, url, data=body, headers=headers, timeout=self._timeout(timeout),
                                         allow_redirects=False)
        return _Response(resp, method, url)

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
