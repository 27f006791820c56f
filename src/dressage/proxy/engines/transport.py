"""The engine client's one transport seam: send a request, read its answer whole, piece by piece or line by line.

:class:`EngineTransport` is the interface :class:`~dressage.proxy.engines.sglang_client.SGLangClient`
talks to; :mod:`.aio_transport` implements it over aiohttp's pool (production), :mod:`.httpx_transport`
over any httpx transport (httpx's own pool, ``httpx.MockTransport`` in tests). Transports raise
:class:`EngineTransportError` only; the client translates it into the project's typed errors.
"""

from __future__ import annotations

from typing import AsyncIterator, Mapping, Protocol

__all__ = ["BodySink", "EngineResponse", "EngineTransport", "EngineTransportError", "EngineTransportTimeout"]


class EngineTransportError(Exception):
    """The request could not be sent or its answer not read whole (refused, reset, broken framing).

    ``kind`` names the failure as httpx names its exceptions (``ConnectError``, ``RemoteProtocolError``,
    ``ReadError``, ``ReadTimeout``, ``ConnectTimeout``), whichever library sent the request."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class EngineTransportTimeout(EngineTransportError):
    """No connection, or no next piece of the answer, within the request's timeout."""


class BodySink(Protocol):
    def feed(self, piece: bytes) -> None: ...


class EngineResponse:
    """An answer whose head has arrived: ``status``, ``headers`` (case-insensitive) and a body still to read.

    Implementations provide :meth:`read`, :meth:`pieces` and :meth:`aclose`; :meth:`feed` and
    :meth:`lines` are built on :meth:`pieces`. Every body read is decompressed (``Content-Encoding``)
    and may raise :class:`EngineTransportError`. The caller closes the response (its connection
    goes back to the pool once the body was read whole).
    """

    __slots__ = ("status", "headers")

    def __init__(self, status: int, headers: Mapping[str, str]) -> None:
        self.status = status
        self.headers = headers

    async def read(self) -> bytes:
        """The whole body."""
        raise NotImplementedError

    def pieces(self) -> AsyncIterator[bytes]:
        """The body in the pieces it arrives in."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release the connection (closed if the body was not read to its end)."""
        raise NotImplementedError

    async def feed(self, sink: BodySink) -> None:
        """The body handed to ``sink.feed`` piece by piece as it arrives."""
        async for piece in self.pieces():
            sink.feed(piece)

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines (UTF-8, without their ``\\n`` / ``\\r\\n``) as they arrive: server-sent events."""
        pending: list[bytes] = []  # a line's pieces, joined once its end arrives (a routing line is MiBs)
        async for piece in self.pieces():
            pending.append(piece)
            if b"\n" not in piece:
                continue
            *done, rest = b"".join(pending).split(b"\n")
            pending = [rest] if rest else []
            for line in done:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if pending:
            yield b"".join(pending).rstrip(b"\r").decode("utf-8", "replace")


class EngineTransport(Protocol):
    """Sends HTTP/1.1 requests to engines over a connection pool."""

    async def send(self, method: str, url: str, *, body: bytes | None, headers: Mapping[str, str],
                   timeout: float) -> EngineResponse:
        """Send ``body`` (``None``: no body) with ``headers`` to the absolute ``url``; the response once its
        head arrives. ``timeout`` bounds connecting and each wait for the answer's next bytes. Raises
        :class:`EngineTransportTimeout` when a deadline passes, :class:`EngineTransportError` when the
        connection fails or the answer is broken; an HTTP error status is an answer, not an error."""
        ...

    async def aclose(self) -> None:
        """Close the pool's connections."""
        ...
