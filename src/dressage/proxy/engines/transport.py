"""The engine client's one transport seam: send a request, read its answer whole, piece by piece or line by line.

Every body read takes a cap: an answer that declares more, or sends more, or a line longer than it,
raises :class:`EngineAnswerTooLarge` as soon as that is known, with at most the cap held. A line
read also takes a deadline that the answer as a whole must meet (keep-alive lines do not extend it).

:class:`EngineTransport` is the interface :class:`~dressage.proxy.engines.sglang_client.SGLangClient`
talks to; :mod:`.aio_transport` implements it over aiohttp's pool (production), :mod:`.httpx_transport`
over any httpx transport (httpx's own pool, ``httpx.MockTransport`` in tests). Transports raise
:class:`EngineTransportError` only; the client translates it into the project's typed errors.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Mapping, Protocol

__all__ = ["BodySink", "EngineAnswerTooLarge", "EngineResponse", "EngineTransport", "EngineTransportError",
           "EngineTransportTimeout"]


class EngineTransportError(Exception):
    """The request could not be sent or its answer not read whole (refused, reset, broken framing).

    ``kind`` names the failure as httpx names its exceptions (``ConnectError``, ``RemoteProtocolError``,
    ``ReadError``, ``ReadTimeout``, ``ConnectTimeout``), whichever library sent the request."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class EngineTransportTimeout(EngineTransportError):
    """No connection, or no next piece of the answer, within the request's timeout."""


class EngineAnswerTooLarge(EngineTransportError):
    """The answer (declared or received) or one of its lines is over the reader's cap; ``limit`` is that cap."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__("AnswerTooLarge", message)
        self.limit = limit


class BodySink(Protocol):
    def feed(self, piece: bytes) -> None: ...


class EngineResponse:
    """An answer whose head has arrived: ``status``, ``headers`` (case-insensitive) and a body still to read.

    Implementations provide :meth:`pieces` and :meth:`aclose`; :meth:`read`, :meth:`feed` and
    :meth:`lines` are built on :meth:`pieces` (an implementation may do the same faster). Every body
    read is decompressed (``Content-Encoding``) and may raise :class:`EngineTransportError`. ``limit``
    caps what a read holds (``None``: no cap): bytes for :meth:`read` and :meth:`feed`, one line for
    :meth:`lines`. The caller closes the response (its connection goes back to the pool once the body
    was read whole; one closed early is dropped).
    """

    __slots__ = ("status", "headers")

    def __init__(self, status: int, headers: Mapping[str, str]) -> None:
        self.status = status
        self.headers = headers

    def declared_size(self) -> int | None:
        """The body's ``Content-Length`` as sent (before decompression); ``None`` when not declared."""
        value = self.headers.get("content-length")
        return int(value) if value is not None and value.strip().isdigit() else None

    def check_declared(self, limit: int | None) -> None:
        """Raise :class:`EngineAnswerTooLarge` when the declared body is over ``limit``: nothing of it is read."""
        size = self.declared_size()
        if limit is not None and size is not None and size > limit:
            raise EngineAnswerTooLarge(f"the answer declares {size} bytes, over the cap of {limit}", limit)

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body."""
        self.check_declared(limit)
        parts: list[bytes] = []
        size = 0
        async for piece in self.pieces():
            size += len(piece)
            if limit is not None and size > limit:
                raise EngineAnswerTooLarge(f"the answer is over the cap of {limit} bytes", limit)
            parts.append(piece)
        return b"".join(parts)

    def pieces(self) -> AsyncIterator[bytes]:
        """The body in the pieces it arrives in (no cap)."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release the connection (closed if the body was not read to its end)."""
        raise NotImplementedError

    async def feed(self, sink: BodySink, limit: int | None = None) -> None:
        """The body handed to ``sink.feed`` piece by piece as it arrives."""
        self.check_declared(limit)
        size = 0
        async for piece in self.pieces():
            size += len(piece)
            if limit is not None and size > limit:
                raise EngineAnswerTooLarge(f"the answer is over the cap of {limit} bytes", limit)
            sink.feed(piece)

    async def lines(self, limit: int | None = None, deadline: float | None = None) -> AsyncIterator[str]:
        """The body's lines (UTF-8, without their ``\\n`` / ``\\r\\n``) as they arrive: server-sent events.

        ``deadline`` (the running loop's clock) is when the body must have ended: a piece that arrives
        later raises :class:`EngineTransportTimeout`, however often pieces came before it."""
        loop = asyncio.get_running_loop() if deadline is not None else None
        pending: list[bytes] = []  # a line's pieces, joined once its end arrives (a routing line is MiBs)
        held = 0
        async for piece in self.pieces():
            if loop is not None and loop.time() > deadline:
                raise EngineTransportTimeout("ReadTimeout", "the streamed answer did not end within its deadline")
            pending.append(piece)
            held += len(piece)
            if b"\n" not in piece:
                if limit is not None and held > limit:
                    raise EngineAnswerTooLarge(f"a line of the answer is over the cap of {limit} bytes", limit)
                continue
            *done, rest = b"".join(pending).split(b"\n")
            pending = [rest] if rest else []
            held = len(rest)
            for line in done:
                if limit is not None and len(line) > limit:
                    raise EngineAnswerTooLarge(f"a line of the answer is over the cap of {limit} bytes", limit)
                yield line.rstrip(b"\r").decode("utf-8", "replace")
            if limit is not None and held > limit:
                raise EngineAnswerTooLarge(f"a line of the answer is over the cap of {limit} bytes", limit)
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
