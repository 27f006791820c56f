"""Request/reply over the bulk stream (``tq/transport/bulk.py``): a threaded TCP server and a pooled client.

The server accepts connections on its own port next to a unit's ZMQ socket and serves each on a thread
(``recv_into`` and ``send`` release the GIL, so one large transfer does not hold up other clients); it
answers with the same handler as the ZMQ socket and the same rules: a message without a valid tag or
seen before is ProtocolError, answered, and counted; a handler failure is a typed error reply; a
message that ends early or stalls for ``stall_s`` closes its connection and stores nothing. The client
turns silence, a refused connection or a broken stream into StorageUnitUnavailable within its timeout,
or sooner when its abort check names a reason (the Controller marked the unit dead).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from dressage.errors import ProtocolError, StorageUnitUnavailable, TransferQueueError
from dressage.tq.transport.bulk import (Conn, RecvPool, StreamBroken, StreamClosed, read_message, shared_pool, tune,
                              write_message)
from dressage.tq.transport.zmq import Handler, run_after_reply
from dressage.tq.transport.wire import (Auth, PayloadTag, ReplayGuard, decode_control, encode, error_from_wire,
                                        error_to_wire)

__all__ = ["BulkServer", "BulkClient", "BulkPending", "TaggedHandler"]

TaggedHandler = Callable[[dict[str, Any], list[Any], list[PayloadTag | None]],
                         "tuple[dict[str, Any], Sequence[Any], Sequence[PayloadTag | None] | None]"]
"""A handler that sees each payload's tag (``wire.PayloadTag``, None for a small one; ``tags`` is None for a
message without authentication) and may answer with tags to forward: ``(reply, payloads, forwarded)``,
``forwarded[i]`` the tag payload ``i``'s writer gave it (its bytes are then sent unread) or None."""

log = logging.getLogger(__name__)
_NO_NONCE = bytes(16)
_MAX_CONNECTIONS = 256
_LOUD_REJECTIONS = 10


class BulkServer:
    """Serves ``handler`` on ``host:port`` (0: any free port), one thread per connection; request
    payloads are received into buffers from ``alloc(nbytes)``."""

    def __init__(self, handler: Handler | TaggedHandler, *, host: str = "127.0.0.1", port: int = 0, name: str = "tq-bulk",
                 secret: bytes | None = None, max_message_bytes: int, alloc: Callable[[int], np.ndarray],
                 stall_s: float = 30.0, tagged: bool = False) -> None:
        # ``tagged``: ``handler`` is a TaggedHandler (it sees the payload tags of authenticated messages).
        self._handler: Any = handler
        self._tagged = tagged
        self._name = name
        self._secret = secret
        self._alloc = alloc
        self.max_message_bytes = int(max_message_bytes)
        self.stall_s = float(stall_s)
        self._guard = ReplayGuard() if secret is not None else None
        self._guard_lock = threading.Lock()
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((host, port))
        except OSError as exc:
            self._listener.close()
            raise TransferQueueError(f"{name}: cannot bind {host}:{port or '*'}: {exc}") from exc
        self._listener.listen(64)
        self._listener.settimeout(0.5)
        self.host, self.port = host, self._listener.getsockname()[1]
        self._thread: threading.Thread | None = None
        self.served = self.rejected = self.untyped = self.broken = 0
        # Work that may wait until a reply is sent, done before the connection reads its next request.
        self.after_reply: Callable[[], None] | None = None

    def start(self) -> "BulkServer":
        self._thread = threading.Thread(target=self._accept, name=f"{self._name}-accept", daemon=True)
        self._thread.start()
        return self

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            with self._lock:
                if len(self._conns) >= _MAX_CONNECTIONS or self._stop.is_set():
                    sock.close()
                    continue
                self._conns.add(sock)
            tune(sock)
            threading.Thread(target=self._serve, args=(sock,), name=f"{self._name}-conn", daemon=True).start()

    def _idle(self, quiet_s: float) -> None:  # between messages: wait for the next one until stopped
        if self._stop.is_set():
            raise StreamBroken("server stopping")

    def _stalled(self, quiet_s: float) -> None:  # within a message: a peer that stops sending is dropped
        if self._stop.is_set() or quiet_s > self.stall_s:
            raise StreamBroken(f"no progress for {quiet_s:.1f} s mid-message")

    def _serve(self, sock: socket.socket) -> None:
        conn = Conn(sock, self._stalled)
        try:
            while not self._stop.is_set():
                if not self._one(conn):
                    break
        except StreamClosed:
            pass
        except StreamBroken as exc:
            if not self._stop.is_set():
                self._count("broken")
                log.debug("%s: dropped a connection: %s", self._name, exc)
        finally:
            with self._lock:
                self._conns.discard(sock)
            conn.close()

    def _count(self, name: str) -> None:  # connection threads count concurrently
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def _admit(self, auth: Auth) -> None:  # a replayed head is refused before its payloads are read
        if self._guard is not None:
            with self._guard_lock:
                self._guard.check(auth)

    def _one(self, conn: Conn) -> bool:
        """Serve one message, then the work that waits for its reply; False when the connection must close."""
        keep = self._reply(conn)
        # The reply's frames (views of stored blobs, maybe a shared-memory segment's) died with ``_reply``:
        # a client that deletes the blob as soon as it has the reply finds it released, not held by us.
        run_after_reply(self.after_reply, self._name)
        return keep

    def _reply(self, conn: Conn) -> bool:
        """Read one message and answer it; False when the connection must close."""
        auth, req_id, keep, forwarded = None, None, True, None
        try:
            control_frame, payloads, auth, tags = read_message(
                conn, secret=self._secret, alloc=self._alloc, max_bytes=self.max_message_bytes, first=self._idle,
                admit=self._admit)
            control = decode_control(control_frame)
            req_id = control.get("id")
            if not isinstance(control.get("op"), str):
                raise ProtocolError("control frame has no 'op'")
            if self._tagged:
                reply, out_payloads, forwarded = self._handler(control, payloads, tags if auth is not None else None)
            else:
                reply, out_payloads = self._handler(control, payloads)
            del payloads
            frames = encode({"ok": True, **reply, "id": req_id}, out_payloads)
            self._count("served")
        except StreamBroken:
            raise
        except Exception as exc:  # every failure becomes a typed reply
            forwarded = None
            if isinstance(exc, ProtocolError):
                self._count("rejected")
                keep = not getattr(exc, "broken", False)
                level = logging.WARNING if self.rejected <= _LOUD_REJECTIONS else logging.DEBUG
                log.log(level, "%s: rejected a message (%d so far): %s", self._name, self.rejected, exc)
            elif not isinstance(exc, TransferQueueError):
                self._count("untyped")
                log.exception("%s: handler failed", self._name)
            if not (isinstance(req_id, int) and not isinstance(req_id, bool) and -2**63 <= req_id < 2**64):
                req_id = None
            # A connection about to close says so, so the client does not pool it for its next call.
            frames = encode({**error_to_wire(exc), "id": req_id, **({} if keep else {"closing": True})})
        write_message(conn, frames[0], frames[1:], secret=self._secret, forwarded=forwarded,
                      nonce=_NO_NONCE if auth is None else auth.nonce, seq=0 if auth is None else auth.seq)
        return keep

    def stop(self) -> None:
        self._stop.set()
        try:  # wakes the accept thread out of accept() now rather than at its next timeout
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for sock in conns:  # wakes the connection threads out of their reads
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._listener.close()


class BulkClient:
    """Calls one BulkServer. Thread-safe: each call borrows a connection from a small pool; reply
    payloads land in ``pool`` buffers."""

    def __init__(self, host: str, port: int, *, timeout_s: float, name: str, secret: bytes | None = None,
                 abort: Callable[[], str | None] | None = None, pool: RecvPool | None = None) -> None:
        self.host, self.port = host, int(port)
        self.address = f"{host}:{port}"
        self.timeout_s = float(timeout_s)
        self.name = name
        self._secret = secret
        self._abort = abort
        self.pool = pool if pool is not None else shared_pool()
        self._idle: list[Conn] = []  # each with its socket and read-ahead buffer
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._nonce = os.urandom(16)
        self._seqs = itertools.count(1)
        self._closed = False

    @classmethod
    def beside(cls, zmq_address: str, port: Any, **kwargs: Any) -> "BulkClient | None":
        """A client of the stream socket at ``port`` on the host a ZMQ address (``tcp://host:port``)
        names, or None when a reply named no usable port (or the address no host)."""
        host = urlsplit(zmq_address).hostname
        if not host or not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            return None
        return cls(host, port, **kwargs)

    def set_abort(self, abort: Callable[[], str | None] | None) -> None:
        self._abort = abort

    def _borrow(self, timeout: float, patience: Callable[[float], None]) -> Conn:
        with self._lock:
            if self._closed:
                raise TransferQueueError(f"{self.name}: client is closed")
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            sock = socket.create_connection((self.host, self.port), timeout=min(timeout, 5.0))
            tune(sock)
            conn = Conn(sock, patience)
        conn.patience = patience
        return conn

    def _give_back(self, conn: Conn) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < 16:
                self._idle.append(conn)
                return
        conn.close()

    def call(self, op: str, control: dict[str, Any] | None = None, payloads: Sequence[Any] = (), *,
             keys: Sequence[str] = (), timeout_s: float | None = None) -> tuple[dict[str, Any], list[np.ndarray]]:
        """One request and its reply: the reply's control map and its payloads (pooled buffers)."""
        return self.begin(op, control, payloads, keys=keys, timeout_s=timeout_s).wait()

    def begin(self, op: str, control: dict[str, Any] | None = None, payloads: Sequence[Any] = (), *,
              keys: Sequence[str] = (), timeout_s: float | None = None) -> "BulkPending":
        """Send one request now and return its :class:`BulkPending`: the caller does other work (a request
        to another peer) while this one is served, then ``wait()``s. The timeout counts from now."""
        req_id = next(self._ids)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        abort = self._abort
        if abort is not None and (why := abort()):
            raise self._unavailable(op, keys, why)
        deadline = time.monotonic() + timeout

        def patience(quiet_s: float) -> None:
            if time.monotonic() > deadline:
                raise StreamBroken(f"no reply within {timeout:g} s")
            why = abort() if abort is not None else None
            if why:
                raise StreamBroken(why)

        try:
            conn = self._borrow(timeout, patience)
        except OSError as exc:
            raise self._unavailable(op, keys, f"cannot connect: {exc}") from exc
        seq = next(self._seqs) if self._secret is not None else 0
        try:
            frame = encode({**(control or {}), "op": op, "id": req_id})[0]
            write_message(conn, frame, payloads, secret=self._secret, nonce=self._nonce, seq=seq)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, StreamBroken):
                raise self._unavailable(op, keys, str(exc)) from exc
            raise
        return BulkPending(self, conn, op, keys, req_id, seq)

    def _finish(self, p: "BulkPending") -> tuple[dict[str, Any], list[np.ndarray]]:
        conn, healthy = p.conn, False
        try:
            control_frame, frames, auth, _ = read_message(conn, secret=self._secret, alloc=self.pool.take,
                                                          max_bytes=1 << 48)
            if auth is not None and (auth.nonce, auth.seq) != (self._nonce, p.seq) and auth.nonce != _NO_NONCE:
                raise ProtocolError(f"{self.name}: a bulk reply names another request")
            reply = decode_control(control_frame)
            if reply.get("id") not in (p.req_id, None):
                raise ProtocolError(f"{self.name}: a bulk reply answers request {reply.get('id')!r:.20}")
            healthy = not reply.get("closing")  # the server drops this connection after the reply
        except StreamBroken as exc:
            raise self._unavailable(p.op, p.keys, str(exc)) from exc
        finally:
            if healthy:
                self._give_back(conn)
            else:
                conn.close()
        if not reply.get("ok"):
            raise error_from_wire(reply, f"{self.name} at {self.address}")
        return reply, frames

    def _unavailable(self, op: str, keys: Sequence[str], why: str) -> StorageUnitUnavailable:
        shown = ", ".join(map(repr, list(keys)[:8])) + (" ..." if len(keys) > 8 else "")
        return StorageUnitUnavailable(f"{self.name} at {self.address} (bulk) is unavailable ({op}: {why})"
                                      + (f"; keys: {shown}" if keys else ""))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class BulkPending:
    """A request :meth:`BulkClient.begin` sent; ``wait()`` (exactly once) returns its reply as ``call`` does."""

    __slots__ = ("client", "conn", "op", "keys", "req_id", "seq", "_done")

    def __init__(self, client: BulkClient, conn: Conn, op: str, keys: Sequence[str], req_id: int, seq: int) -> None:
        self.client, self.conn, self.op, self.keys, self.req_id, self.seq = client, conn, op, keys, req_id, seq
        self._done = False

    def wait(self) -> tuple[dict[str, Any], list[np.ndarray]]:
        if self._done:
            raise TransferQueueError(f"{self.client.name}: the reply to {self.op} was already taken")
        self._done = True
        return self.client._finish(self)
