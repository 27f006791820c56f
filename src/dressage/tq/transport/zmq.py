"""Request/reply over ZMQ for TransferQueue: a ROUTER server loop and a DEALER client with timeouts.

The server answers one message at a time and never waits on a peer (ROUTER drops replies to peers that
are gone or not reading), so one slow client cannot stall the others. The client keeps a small pool of
sockets so threads can call concurrently, and turns silence into StorageUnitUnavailable within a bound
(or sooner, when a caller-supplied check says the peer is known dead). With a shared secret, every
message both ways carries a MAC frame (``wire.sign``) and anything without a valid one is ProtocolError;
each request is accepted once (nonce and sequence window) and each reply names the request it
answers. ``ZMQ_MAXMSGSIZE`` bounds what a listening socket reads from any peer. A request whose
connection closes before its reply (the peer process died) ends at once: the reply is lost with the
connection, so waiting out the timeout would only delay the caller.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from dressage.errors import ProtocolError, StorageUnitUnavailable, TransferQueueError
from dressage.tq.transport.wire import (ReplayGuard, decode_control, encode, error_from_wire, error_to_wire, open_frames,
                              sign)

__all__ = ["RpcServer", "RpcClient", "PendingReply", "Handler", "run_after_reply"]

log = logging.getLogger(__name__)
# handler(control, payload_frames) -> (reply_control, reply_payloads)
Handler = Callable[[dict[str, Any], list[Any]], "tuple[dict[str, Any], Sequence[Any]]"]
_POLL_MS = 1000
_HWM = 1000
# Zero-copy sends cost a Frame object and a release notification each; below this size copying is cheaper.
_ZERO_COPY_MIN = 64 * 1024
# While waiting for a reply, how often the caller's ``abort`` check runs (a dead peer ends the wait).
_ABORT_POLL_S = 0.1
_LOUD_REJECTIONS = 10  # rejected frames logged as warnings; later ones at debug level
# Controller and heartbeat sockets: control frames only (the decoder takes 16 MiB), and libzmq buffers a
# whole frame before its MAC can be checked, so nothing larger is read.
CONTROL_MAX_MESSAGE = 17 * 1024 * 1024
_NO_NONCE = bytes(16)


def send_frames(sock: zmq.Socket, frames: Sequence[Any], flags: int = 0) -> None:
    """Send a multipart message: large buffers without a copy, small ones copied."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        more = zmq.SNDMORE if i < last else 0
        size = frame.nbytes if hasattr(frame, "nbytes") else len(frame)
        sock.send(frame, flags | more, copy=size < _ZERO_COPY_MIN)


def _request_id(frame: Any) -> Any:
    """The id of a refused request, when its control frame can be read, so its sender gets the refusal
    at once instead of waiting out its timeout (the refusal itself carries no data)."""
    try:
        rid = decode_control(frame).get("id")
    except ProtocolError:
        return None
    return rid if isinstance(rid, int) and not isinstance(rid, bool) else None


def run_after_reply(work: Callable[[], None] | None, server: str) -> None:
    """A server's work after a reply (``after_reply``), if any: a failure is logged, never raised into
    the loop that serves the next request."""
    if work is not None:
        try:
            work()
        except Exception:
            log.exception("%s: work after a reply failed", server)


class RpcServer:
    """A ROUTER socket bound to ``tcp://host:port`` serving ``handler`` on one thread."""

    def __init__(self, handler: Handler, *, host: str = "127.0.0.1", port: int = 0, name: str = "tq",
                 secret: bytes | None = None, max_message_bytes: int = CONTROL_MAX_MESSAGE) -> None:
        self._handler = handler
        self._name = name
        self._secret = secret
        self._guard = ReplayGuard() if secret is not None else None
        self.max_message_bytes = int(max_message_bytes)
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        # libzmq drops a peer that sends a larger frame while reading it: nothing that size is buffered.
        self._sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        self._sock.setsockopt(zmq.SNDHWM, _HWM)
        self._sock.setsockopt(zmq.RCVHWM, _HWM)
        try:
            if port:
                self._sock.bind(f"tcp://{host}:{port}")
                self.port = port
            else:
                self.port = self._sock.bind_to_random_port(f"tcp://{host}")
        except zmq.ZMQError as exc:
            self._sock.close(0)
            raise TransferQueueError(f"{name}: cannot bind tcp://{host}:{port or '*'}: {exc}") from exc
        self.host = host
        # stop() wakes the loop through this inproc pair instead of waiting out a poll timeout.
        self._wake_addr = f"inproc://tq-wake-{id(self)}"
        self._wake = self._ctx.socket(zmq.PULL)
        self._wake.bind(self._wake_addr)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.served = 0
        self.rejected = 0
        self.untyped = 0  # handler failures that were not TransferQueueErrors: bugs, which fuzzing counts
        # Work that may wait until the reply is sent, and must be done before the next request is read.
        self.after_reply: Callable[[], None] | None = None

    @property
    def address(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def start(self) -> "RpcServer":
        """Serve on a daemon thread (the socket moves to that thread)."""
        self._thread = threading.Thread(target=self.serve, name=f"{self._name}-server", daemon=True)
        self._thread.start()
        return self

    def serve(self) -> None:
        """Serve until :meth:`stop`; closes the socket on the way out."""
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if self._sock not in dict(poller.poll(_POLL_MS)):
                    continue
                try:
                    frames = self._sock.recv_multipart(copy=False, flags=zmq.NOBLOCK)
                except zmq.Again:
                    continue
                self._answer(frames)
        finally:
            self._sock.close(0)
            self._wake.close(0)

    def _answer(self, frames: list[Any]) -> None:
        self._reply(frames)  # the reply's frames (views of stored blobs) die with it, before the work after it
        run_after_reply(self.after_reply, self._name)

    def _reply(self, frames: list[Any]) -> None:
        ident, body = frames[0], frames[1:]
        req_id = None
        auth = None
        try:
            if not body:
                raise ProtocolError("empty message")
            total = sum(len(f.buffer) if hasattr(f, "buffer") else len(f) for f in body)
            if total > self.max_message_bytes:  # before any MAC is computed over it
                raise ProtocolError(f"message of {total} bytes exceeds this socket's {self.max_message_bytes}")
            if self._secret is not None:
                body, auth = open_frames(body, self._secret)
                self._guard.check(auth)  # type: ignore[union-attr]
            control = decode_control(body[0])
            req_id = control.get("id")
            if not isinstance(control.get("op"), str):
                raise ProtocolError("control frame has no 'op'")
            reply, payloads = self._handler(control, body[1:])
            if control.get("oneway") is True:  # its sender reads no reply: a refusal is still sent back
                self.served += 1
                return
            out = encode({"ok": True, **reply, "id": req_id}, payloads)  # a reply that cannot be encoded fails here
            self.served += 1
        except Exception as exc:  # every failure becomes a typed reply; the loop keeps serving
            if isinstance(exc, ProtocolError):
                self.rejected += 1
                # A flood of bad frames (a scanner, a fuzzer) must not flood the log as well.
                level = logging.WARNING if self.rejected <= _LOUD_REJECTIONS else logging.DEBUG
                log.log(level, "%s: rejected a frame (%d so far): %s", self._name, self.rejected, exc)
            elif not isinstance(exc, TransferQueueError):
                self.untyped += 1
                log.exception("%s: handler failed", self._name)
            if req_id is None and body:
                req_id = _request_id(body[0])
            if not (isinstance(req_id, int) and not isinstance(req_id, bool) and -2**63 <= req_id < 2**64):
                req_id = None
            out = encode({**error_to_wire(exc), "id": req_id})
        if self._secret is not None:
            # A reply names the request it answers (its sender's nonce and sequence number).
            out.append(sign(out, self._secret, nonce=_NO_NONCE if auth is None else auth.nonce,
                            seq=0 if auth is None else auth.seq))
        try:
            send_frames(self._sock, [ident, *out], zmq.NOBLOCK)
        except zmq.Again:  # the peer is not reading; dropping its reply keeps everyone else served
            log.warning("%s: dropped a reply to a peer that is not reading", self._name)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is None:
            self._sock.close(0)
            self._wake.close(0)
            return
        poke = self._ctx.socket(zmq.PUSH)
        poke.setsockopt(zmq.LINGER, 0)
        poke.connect(self._wake_addr)
        try:
            poke.send(b"", flags=zmq.NOBLOCK)
        except zmq.Again:
            pass
        finally:
            poke.close(0)
        self._thread.join(timeout=5)


class RpcClient:
    """Calls one RpcServer. Thread-safe: each call borrows a DEALER socket from a small pool."""

    def __init__(self, address: str, *, timeout_s: float, name: str, secret: bytes | None = None,
                 abort: Callable[[], str | None] | None = None) -> None:
        self.address = address
        self._secret = secret
        self._abort = abort
        self.timeout_s = float(timeout_s)
        self.name = name
        self._ctx = zmq.Context.instance()
        self._idle: list[zmq.Socket] = []
        self._monitors: dict[int, zmq.Socket] = {}  # per socket: its connection's disconnect events
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._nonce = os.urandom(16)        # this client's name in the server's replay window
        self._seqs = itertools.count(1)
        self._closed = False

    def set_abort(self, abort: Callable[[], str | None] | None) -> None:
        """The check every call runs before sending and while waiting (None: wait out the timeout)."""
        self._abort = abort

    def _borrow(self) -> zmq.Socket:
        with self._lock:
            if self._closed:
                raise TransferQueueError(f"{self.name}: client is closed")
            if self._idle:
                sock = self._idle.pop()
                _drain(self._monitors[id(sock)])  # disconnects before this request are no news for it
                return sock
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sock.connect(self.address)
        with self._lock:
            self._monitors[id(sock)] = monitor
        return sock

    def _give_back(self, sock: zmq.Socket) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < 16:
                self._idle.append(sock)
                return
        self._discard(sock)

    def _discard(self, sock: zmq.Socket) -> None:
        with self._lock:
            monitor = self._monitors.pop(id(sock), None)
        if monitor is not None:
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
            monitor.close(0)
        sock.close(0)

    def send_oneway(self, op: str, control: dict[str, Any] | None = None, *, keys: Sequence[str] = ()) -> None:
        """Send a request without waiting. The server answers only a refusal (discarded by the socket's
        next call), so a stream of one-way requests leaves no replies to read."""
        message = {**(control or {}), "op": op, "id": -next(self._ids), "oneway": True}
        sock = self._borrow()
        try:
            sock.send_multipart(self._frames(message, ())[0], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self._discard(sock)
            raise self._unavailable(op, keys, f"send failed: {exc}") from exc
        self._give_back(sock)

    def _frames(self, message: dict[str, Any], payloads: Sequence[Any]) -> tuple[list[Any], int]:
        frames = encode(message, payloads)
        seq = 0
        if self._secret is not None:
            seq = next(self._seqs)
            frames.append(sign(frames, self._secret, nonce=self._nonce, seq=seq))
        return frames, seq

    def call(self, op: str, control: dict[str, Any] | None = None, payloads: Sequence[Any] = (), *,
             keys: Sequence[str] = (), timeout_s: float | None = None,
             abort: Callable[[], str | None] | None = None) -> tuple[dict[str, Any], list[Any]]:
        """Send one request and wait for its reply; raise the server's typed error or
        StorageUnitUnavailable (naming this peer and ``keys``) when no reply comes in time, or as soon
        as ``abort()`` (default: the client's own check) returns a reason such as "marked dead"."""
        return self.begin(op, control, payloads, keys=keys, timeout_s=timeout_s, abort=abort).wait()

    def begin(self, op: str, control: dict[str, Any] | None = None, payloads: Sequence[Any] = (), *,
              keys: Sequence[str] = (), timeout_s: float | None = None,
              abort: Callable[[], str | None] | None = None) -> "PendingReply":
        """Send one request now and return its :class:`PendingReply`: the caller does other work (a
        request to another peer) while this one is served, then ``wait()``s. The timeout counts from now."""
        req_id = next(self._ids)
        message = {**(control or {}), "op": op, "id": req_id}
        timeout = self.timeout_s if timeout_s is None else timeout_s
        abort = self._abort if abort is None else abort
        if abort is not None:
            why = abort()
            if why:
                raise self._unavailable(op, keys, why)
        sock = self._borrow()
        try:
            frames, seq = self._frames(message, payloads)
            send_frames(sock, frames, zmq.NOBLOCK)
        except BaseException as exc:
            self._discard(sock)
            if isinstance(exc, zmq.ZMQError):
                raise self._unavailable(op, keys, f"send failed: {exc}") from exc
            raise
        return PendingReply(self, sock, op, keys, req_id, seq, time.monotonic() + timeout, timeout, abort)

    def _await(self, p: "PendingReply") -> tuple[dict[str, Any], list[Any]]:
        sock, abort, op, keys = p.sock, p.abort, p.op, p.keys
        with self._lock:
            monitor = self._monitors.get(id(sock))
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        if monitor is not None:
            poller.register(monitor, zmq.POLLIN)
        healthy = False
        try:
            while True:
                left = p.deadline - time.monotonic()
                if left <= 0:
                    raise self._unavailable(op, keys, f"no reply within {p.timeout:g} s")
                step = left if abort is None else min(left, _ABORT_POLL_S)
                ready = dict(poller.poll(int(step * 1000) + 1))
                if sock not in ready:
                    if monitor is not None and monitor in ready and _drain(monitor):
                        raise self._unavailable(op, keys, "the connection closed before the reply (the peer "
                                                          "process exited or restarted)")
                    why = abort() if abort is not None else None
                    if why:
                        raise self._unavailable(op, keys, why)
                    continue
                frames = sock.recv_multipart(copy=False)
                if self._secret is not None:
                    frames, auth = open_frames(frames, self._secret)
                    if auth.nonce != self._nonce or auth.seq != p.seq:
                        if auth.nonce == _NO_NONCE:  # the server could not authenticate our request
                            reply = decode_control(frames[0])
                            break
                        log.debug("%s: discarded a reply to another request", self.name)
                        continue
                reply = decode_control(frames[0])
                if reply.get("id") == p.req_id:
                    break
                log.debug("%s: discarded a stale reply", self.name)
            healthy = True
        finally:
            # A socket that timed out may still receive the late reply: never reuse it.
            if healthy:
                self._give_back(sock)
            else:
                self._discard(sock)
        if not reply.get("ok"):
            raise error_from_wire(reply, f"{self.name} at {self.address}")
        return reply, frames[1:]

    def _unavailable(self, op: str, keys: Sequence[str], why: str) -> StorageUnitUnavailable:
        shown = ", ".join(map(repr, list(keys)[:8])) + (" ..." if len(keys) > 8 else "")
        return StorageUnitUnavailable(
            f"{self.name} at {self.address} is unavailable ({op}: {why})" + (f"; keys: {shown}" if keys else "")
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock in idle:
            self._discard(sock)


def _drain(monitor: zmq.Socket) -> int:
    """Read every pending event of a socket monitor; how many disconnects there were."""
    n = 0
    while True:
        try:
            frames = monitor.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return n
        if frames and len(frames[0]) >= 2 and int.from_bytes(frames[0][:2], "little") == zmq.EVENT_DISCONNECTED:
            n += 1


class PendingReply:
    """A request :meth:`RpcClient.begin` sent; ``wait()`` (exactly once) returns its reply as ``call`` does."""

    __slots__ = ("client", "sock", "op", "keys", "req_id", "seq", "deadline", "timeout", "abort", "_done")

    def __init__(self, client: RpcClient, sock: zmq.Socket, op: str, keys: Sequence[str], req_id: int, seq: int,
                 deadline: float, timeout: float, abort: Callable[[], str | None] | None) -> None:
        self.client, self.sock, self.op, self.keys = client, sock, op, keys
        self.req_id, self.seq, self.deadline, self.timeout, self.abort = req_id, seq, deadline, timeout, abort
        self._done = False

    def wait(self) -> tuple[dict[str, Any], list[Any]]:
        if self._done:
            raise TransferQueueError(f"{self.client.name}: the reply to {self.op} was already taken")
        self._done = True
        return self.client._await(self)
