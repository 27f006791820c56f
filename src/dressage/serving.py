"""Run an ASGI app under uvicorn: blocking (a ``serve`` command) or on a daemon thread (tests, ``dressage run``).

Binding happens here, before uvicorn starts, so port 0 yields the real port and bind errors
become a ConfigError naming the address. :class:`ConnectionLimits` bound what one connection may
hold: its request line and headers must be complete ``header_timeout_s`` after it opened (or
after its previous answer, once a next request began), its body ``body_timeout_s`` after its
headers, else the connection is closed; headers are at most ``max_header_bytes``; an idle
keep-alive connection is closed after ``keep_alive_s``. Slow senders (slowloris) cannot pile up. A server
words its answer to a request refused before any route sees it, oversized headers or what the HTTP parser
cannot read, itself (:data:`HeadRefusal`; plain text, in uvicorn's words, unless it says otherwise).
The HTTP parser is httptools (C) where it is installed, h11 otherwise, on uvloop's event loop
where that is installed; the limits hold for both parsers. A serving process's cyclic collector is set
up here too (:func:`tune_gc_for_serving`): start-up frozen, calls in flight and sessions swept out of its walks.
"""

from __future__ import annotations

import gc
import socket
import threading
import time
from dataclasses import dataclass
from enum import Enum
from http import HTTPStatus
from typing import Any, Callable

from dressage.errors import ConfigError

__all__ = ["UvicornServer", "ConnectionLimits", "Refused", "HeadRefusal", "plain_head_refusal", "guarded_protocol",
           "tune_gc_for_serving", "ServingGc", "YoungSweeper", "GcPauses", "GC_PAUSES"]


SERVING_GC_YOUNG = 20_000
"""The youngest generation's collection threshold once serving (Python's default: 700)."""


@dataclass(frozen=True, slots=True)
class ServingGc:
    """How a serving process runs its cyclic collector (see :func:`tune_gc_for_serving`).

    ``young``: the youngest generation's threshold, a backstop between sweeps. ``sweep_every_s``: how
    often the young generation is collected and its survivors frozen (0 turns sweeping off).
    ``full_every_s``: how often a full collection looks through the frozen generation too.
    ``idle_full_every_s``: with an ``idle`` test given to the sweeper, a full collection is also made
    when the process has gone idle after work, at most this often (0: never on idleness).
    """

    young: int = SERVING_GC_YOUNG
    sweep_every_s: float = 0.1
    full_every_s: float = 3600.0
    idle_full_every_s: float = 60.0

    def __post_init__(self) -> None:
        if self.young < 1 or self.sweep_every_s < 0 or self.full_every_s <= 0 or self.idle_full_every_s < 0:
            raise ConfigError("serving gc: young >= 1, sweep_every_s >= 0, full_every_s > 0, idle_full_every_s "
                              f">= 0; got {self}")


class YoungSweeper:
    """Collects the young generation every ``sweep_every_s`` and freezes what survived, on a daemon thread.

    A serving process's live objects are mostly calls in flight (seconds each) and sessions held, and it
    makes next to no cyclic garbage (a 1,024-session load collected 0 objects in the 12 collections made
    while it ran). Left to the collector, those objects stay in the generations it walks: its young
    threshold counts net allocations, frees of older objects count against it, so at ~800 calls in flight
    a young collection walked up to 160K objects (55-220 ms with the GIL held: the event loop serves no
    one meanwhile).
    Swept often, the young generation holds only the last ``sweep_every_s`` of survivors (a few thousand
    objects, a few ms); frozen, they are never walked again, and refcounting still frees them. Cyclic
    garbage that outlives a sweep waits in the frozen generation for the full collection (unfreeze,
    collect, freeze) made every ``full_every_s``: that walk covers every live object, start-up's
    included, so it is rare. With an ``idle`` test (no call in flight), the first sweep that finds the
    process idle after work makes that full collection too (at most every ``idle_full_every_s``): a
    drained process gives back its cyclic garbage while nobody waits on it. The frozen generation's size
    is not looked at: counting it walks it too (``gc.get_freeze_count``, ~40 ms at 400K objects).
    Finalizers of cyclic garbage found by a sweep run on this thread, as they run on whichever thread an
    automatic collection happens to start on.
    """

    def __init__(self, policy: ServingGc, idle: Callable[[], bool] | None = None) -> None:
        self.policy = policy
        self.idle = idle
        """Whether the process serves nothing now; called on the sweeper's thread."""
        self.full_at = 0.0
        """The ``time.monotonic()`` from which the next sweep is a full collection."""
        self._last_full = 0.0
        self._worked = False
        """A sweep saw the process busy since the last full collection."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None and self.policy.sweep_every_s > 0:
            self._rebase()
            self._thread = threading.Thread(target=self._run, name="dressage-gc-sweep", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _rebase(self) -> None:
        self._last_full = time.monotonic()
        self.full_at = self._last_full + self.policy.full_every_s
        self._worked = False

    def _idle_after_work(self) -> bool:
        if self.idle is None or not self.policy.idle_full_every_s:
            return False
        if not self.idle():
            self._worked = True
            return False
        return self._worked and time.monotonic() - self._last_full >= self.policy.idle_full_every_s

    def sweep(self) -> bool:
        """One sweep; returns whether it was a full collection."""
        if self._idle_after_work() or time.monotonic() >= self.full_at:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self._rebase()
            return True
        gc.collect(1)  # the young generation and what collections since the last sweep moved on from it
        gc.freeze()
        return False

    def _run(self) -> None:
        while not self._stop.wait(self.policy.sweep_every_s):
            self.sweep()


def tune_gc_for_serving(policy: ServingGc | None = None, *, idle: Callable[[], bool] | None = None) -> YoungSweeper:
    """Set the cyclic collector up for a serving process, once it serves; returns its running sweeper.

    - Collect once, then freeze (``gc.freeze``) what is left: what start-up made (modules, the app,
      the tokenizer, the clients) lives as long as the process, and every full collection walked
      all of it again (~170K objects in the Proxy, ~100 ms of the event loop each).
    - Sweep the young generation into the frozen one every ``sweep_every_s`` (:class:`YoungSweeper`),
      so no collection walks a call in flight or a session held more than once; ``idle`` (no call in
      flight) lets it collect everything once the process drains.
    - Collect the youngest generation every ``young`` net allocations of tracked objects instead of
      700, between sweeps: with 64 calls in flight their live objects crossed 700 about every 4 calls.
    - Count the collector's pauses from then on (:data:`GC_PAUSES`, in ``GET /trajectory/stats``).
    """
    policy = policy or ServingGc()
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(policy.young, middle, old)
    GC_PAUSES.install()
    sweeper = YoungSweeper(policy, idle)
    sweeper.start()
    return sweeper


class GcPauses:
    """The cyclic collector's pauses in this process since :meth:`install`: how many, their sum, the longest.

    A collection holds the GIL from start to end, so in a serving process each one is event-loop time no
    request gets; its length grows with the objects it walks (the young generation's includes every call
    in flight, a full one every live session's state). ``GET /trajectory/stats`` reports them as ``gc``.
    """

    __slots__ = ("collections", "full_collections", "pause_s", "max_pause_s", "_since", "_installed")

    def __init__(self) -> None:
        self.collections = self.full_collections = 0
        self.pause_s = self.max_pause_s = 0.0
        self._since = 0.0
        self._installed = False

    def install(self) -> None:
        """Start counting (once per process; a second call changes nothing)."""
        if not self._installed:
            self._installed = True
            gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._since = time.perf_counter()
            return
        spent = time.perf_counter() - self._since
        self.collections += 1
        self.full_collections += info["generation"] == 2
        self.pause_s += spent
        self.max_pause_s = max(self.max_pause_s, spent)

    def snapshot(self) -> dict[str, Any]:
        return {"collections": self.collections, "full_collections": self.full_collections,
                "pause_s": round(self.pause_s, 6), "max_pause_ms": round(self.max_pause_s * 1e3, 3)}


GC_PAUSES = GcPauses()
"""This process's collector pauses: the collector is one per process, so is its clock."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float = 30.0
    body_timeout_s: float = 120.0
    keep_alive_s: float = 30.0
    max_header_bytes: int = 64 * 1024


class _Deadlines:
    """Header and body deadlines for a uvicorn HTTP protocol (checked by one timer per connection).

    Mixed in before uvicorn's ``H11Protocol`` or ``HttpToolsProtocol``: both keep the request in
    flight as ``self.cycle`` (``response_complete``, ``more_body``) and call ``on_response_complete``.
    """

    limits: ConnectionLimits
    tick: float

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._waiting_since = self.loop.time()  # type: ignore[attr-defined]
        self._fresh, self._pending = True, False
        self._seen: Any = None
        self._body_since = 0.0
        self._watch: Any = self.loop.call_later(self.tick, self._check)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle  # type: ignore[attr-defined]
        if cycle is None or cycle.response_complete:
            self._pending = True  # bytes of a next request: its headers are now on the clock
        super().data_received(data)  # type: ignore[misc]

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._waiting_since, self._fresh, self._pending = self.loop.time(), False, False  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        super().connection_lost(exc)  # type: ignore[misc]

    def _check(self) -> None:
        self._watch = None
        transport, limits = self.transport, self.limits  # type: ignore[attr-defined]
        if transport.is_closing():
            return
        now, cycle = self.loop.time(), self.cycle  # type: ignore[attr-defined]
        if cycle is not self._seen:  # a new request's headers are complete
            self._seen, self._body_since, self._pending = cycle, now, False
        if cycle is None or cycle.response_complete:
            late = (self._fresh or self._pending) and now - self._waiting_since > limits.header_timeout_s
        else:
            late = cycle.more_body and now - self._body_since > limits.body_timeout_s
        if late:
            transport.close()
            return
        self._watch = self.loop.call_later(self.tick, self._check)  # type: ignore[attr-defined]


def _tick(limits: ConnectionLimits) -> float:
    return max(0.05, min(limits.header_timeout_s, limits.body_timeout_s) / 4)


_START_BYTES = 2048
"""How much of a request's head is kept to name its path in a refusal (a longer request line goes unnamed)."""


class _HeadBytes:
    """The bytes of a request line and its headers, counted as reads arrive and before a parser consumes
    them, up to the blank line that ends them (which may straddle two reads): a whole request arriving in
    one read is parsed, answered and forgotten within one call, so a count taken after parsing never sees it.
    Its first bytes are kept too, for :meth:`path`."""

    __slots__ = ("count", "_tail", "_start")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.count, self._tail, self._start = 0, b"", b""

    def add(self, data: bytes) -> int:
        if len(self._start) < _START_BYTES:
            self._start += data[:_START_BYTES - len(self._start)]
        seen = self._tail + data
        end = seen.find(b"\r\n\r\n")
        self.count += len(data) if end < 0 else end + 4 - len(self._tail)
        self._tail = seen[-3:]
        return self.count

    def path(self) -> str | None:
        """The path of the request line (no query string); ``None`` when the line was not received whole."""
        line, ended, _ = self._start.lstrip(b"\r\n").partition(b"\r\n")
        parts = line.split(b" ")
        if not ended or len(parts) != 3:
            return None
        return parts[1].split(b"?", 1)[0].decode("latin-1")


class Refused(Enum):
    """Why the connection answers a request itself, before any route sees it; the value is the plain-text
    answer (:func:`plain_head_refusal`)."""

    HEADERS_TOO_LARGE = "Request headers too large."
    """The request line and headers pass ``max_header_bytes``: answered before they are parsed."""
    BAD_REQUEST = "Invalid HTTP request received."
    """The HTTP parser refused the request: its request line, a header or its body's framing (a chunk size, a
    ``Content-Length``) is not HTTP/1.1. uvicorn's words for it."""


HeadRefusal = Callable[[str | None, Refused], tuple[int, list[tuple[bytes, bytes]], bytes]]
"""A server's answer to a request the connection refuses (:class:`Refused`): given the request's path
(``None`` when its request line did not arrive whole, or is not a method, a target and a version) and why,
the status, headers and body. It is sent after the server's default headers (``date``, ``server``), with
``content-length`` and ``connection: close``, and the connection is closed. It runs on the server's event
loop."""


def plain_head_refusal(path: str | None, why: Refused) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The default :data:`HeadRefusal`: 400 with the plain-text words of ``why`` (uvicorn's own answer to a
    request its parser refuses, byte for byte with httptools)."""
    return 400, [(b"content-type", b"text/plain; charset=utf-8")], why.value.encode()


def _refuse(protocol: Any, refuse: HeadRefusal, why: Refused, path: str | None) -> None:
    """Answer ``refuse``'s words on ``protocol``'s connection and close it."""
    transport = protocol.transport
    if transport.is_closing():
        return
    status, headers, body = refuse(path, why)
    lines = [b"HTTP/1.1 %d %s" % (status, HTTPStatus(status).phrase.encode()),
             *(name + b": " + value for name, value in (*protocol.server_state.default_headers, *headers)),
             b"content-length: %d" % len(body), b"connection: close"]
    transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
    transport.close()


def _refuse_unreadable(protocol: Any, refuse: HeadRefusal, head: _HeadBytes) -> None:
    """What uvicorn's protocols do where their parser refuses a request (``send_400_response``, its own
    plain-text 400): ``refuse``'s answer instead, naming the request's path where it is known (from its
    head, or, once the head was read and its body's framing failed, from the request in progress). An
    answer already begun for that request cannot be replaced: the connection is only closed."""
    cycle = protocol.cycle
    if cycle is not None and cycle.more_body:  # the request in progress: its body could not be read
        if cycle.response_started:
            protocol.transport.close()
            return
        path = cycle.scope["raw_path"].split(b"?", 1)[0].decode("latin-1")
    else:
        path = head.path()
    _refuse(protocol, refuse, Refused.BAD_REQUEST, path)


def _guarded_h11(limits: ConnectionLimits, refuse: HeadRefusal) -> type:
    """uvicorn's h11 (pure Python) protocol with the deadlines and a bound on header bytes: h11's own
    bound (``h11_max_incomplete_event_size``) covers a header block still incomplete, this one also a block
    that arrives whole in one read. Bytes are counted while h11 waits for a request (between requests on a
    connection); past ``max_header_bytes`` the answer is ``refuse``'s and the connection is closed, unparsed.
    A request h11 cannot read is answered with ``refuse``'s words too."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(_Deadlines, H11Protocol):
        def connection_made(self, transport: Any) -> None:
            self._head = _HeadBytes()
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE and self._head.add(data) > limits.max_header_bytes:
                _refuse(self, refuse, Refused.HEADERS_TOO_LARGE, self._head.path())
                return
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # a request's head was read: the next one counts anew
                self._head.reset()

        def send_400_response(self, msg: str) -> None:
            _refuse_unreadable(self, refuse, self._head)

    GuardedH11Protocol.limits, GuardedH11Protocol.tick = limits, _tick(limits)
    return GuardedH11Protocol


def _guarded_httptools(limits: ConnectionLimits, refuse: HeadRefusal) -> type:
    """uvicorn's httptools (llhttp, C) protocol with the deadlines and a bound on header bytes.

    The bytes received while no request body is being read (a request line and headers, or the
    idle gap before them) are counted; past ``max_header_bytes`` the answer is ``refuse``'s and the
    connection is closed, before the parser has buffered more. A request llhttp cannot read is answered
    with ``refuse``'s words too.
    """
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpToolsProtocol(_Deadlines, HttpToolsProtocol):
        def connection_made(self, transport: Any) -> None:
            self._head, self._in_body = _HeadBytes(), False
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            if not self._in_body and self._head.add(data) > limits.max_header_bytes:
                _refuse(self, refuse, Refused.HEADERS_TOO_LARGE, self._head.path())
                return
            super().data_received(data)

        def send_400_response(self, msg: str) -> None:
            _refuse_unreadable(self, refuse, self._head)

        def on_headers_complete(self) -> None:
            self._in_body = True
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._in_body = False
            self._head.reset()
            super().on_message_complete()

    GuardedHttpToolsProtocol.limits, GuardedHttpToolsProtocol.tick = limits, _tick(limits)
    return GuardedHttpToolsProtocol


def guarded_protocol(limits: ConnectionLimits, http: str = "auto",
                     refuse_head: HeadRefusal = plain_head_refusal) -> type:
    """The HTTP protocol class uvicorn serves with: ``httptools`` (C parser) when it is installed and
    ``http`` is ``auto`` or ``httptools``, else ``h11``; both keep :class:`ConnectionLimits`, and answer
    oversized headers and a request their parser refuses with ``refuse_head``'s answer."""
    if http not in ("auto", "h11", "httptools"):
        raise ConfigError(f"http: {http!r} is not one of auto, h11, httptools")
    if http != "h11":
        try:
            import httptools  # noqa: F401
        except ImportError:
            if http == "httptools":
                raise ConfigError("http: httptools is not installed (pip install 'dressage[server]')") from None
        else:
            return _guarded_httptools(limits, refuse_head)
    return _guarded_h11(limits, refuse_head)


def _event_loop() -> str:
    """uvloop's event loop where it is installed (its I/O is in C), asyncio's otherwise."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


class UvicornServer:
    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, name: str = "server",
                 log_level: str = "warning", limits: ConnectionLimits | None = None, http: str = "auto",
                 own_log_handlers: bool = True, refuse_head: HeadRefusal = plain_head_refusal) -> None:
        self.app, self.host, self.port, self.name, self.log_level = app, host, int(port), name, log_level
        self.own_log_handlers = own_log_handlers
        """uvicorn installs its text handlers; ``False`` leaves its records to the root logger's (JSON lines)."""
        self.limits = limits or ConnectionLimits()
        self.protocol = guarded_protocol(self.limits, http, refuse_head)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._bound: int | None = None

    @property
    def url(self) -> str:
        if self._bound is None:
            raise RuntimeError(f"the {self.name} is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._bound}"

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
        # and without it every answer with a body waits out a delayed ACK (~40 ms).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"{self.name}.port: cannot bind {self.host}:{self.port}: {exc}") from exc
        self._bound = sock.getsockname()[1]
        return sock

    def _uvicorn(self) -> Any:
        import uvicorn

        after_serving = self.after_serving

        class Server(uvicorn.Server):
            async def serve(self, sockets: Any = None) -> None:
                try:
                    await super().serve(sockets=sockets)
                finally:
                    await after_serving()

        lim = self.limits
        log_kw = {} if self.own_log_handlers else {"log_config": None}
        return Server(uvicorn.Config(self.app, log_level=self.log_level, access_log=False, **log_kw,
                                     lifespan="off", timeout_keep_alive=lim.keep_alive_s, loop=_event_loop(),
                                     http=self.protocol, h11_max_incomplete_event_size=lim.max_header_bytes))

    async def after_serving(self) -> None:
        """Runs on the server's own event loop once it stopped serving: a subclass closes there what lives
        on that loop (connection pools). Nothing here."""

    def serve(self, on_bound: Callable[[str], None] | None = None) -> None:
        """Serve until interrupted; ``on_bound(url)`` once the port is bound (the port ``0`` chose)."""
        sock = self._bind()
        if on_bound is not None:
            on_bound(self.url)
        self._server = self._uvicorn()
        self._server.run(sockets=[sock])

    def start_background(self, timeout: float = 10.0) -> str:
        """Start on a daemon thread; returns the base URL once the server accepts connections."""
        if self._thread is not None:
            return self.url
        sock = self._bind()
        self._server = self._uvicorn()
        self._server.install_signal_handlers = lambda: None  # only the main thread may install them
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=f"dressage-{self.name}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the {self.name} did not start within {timeout} s")
            time.sleep(0.01)
        return self.url

    @property
    def running(self) -> bool:
        """Whether the background server thread is still serving."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None

    def __enter__(self) -> "UvicornServer":
        self.start_background()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
