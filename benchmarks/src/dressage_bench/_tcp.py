"""``tcp-loopback``: the floor of any socket path on this host, measured in the same run.

Two plain TCP hops per round, as ``dressage-zmq`` makes (writer -> unit on put, unit -> reader on get):
the bench process sends each payload to a second process, which receives it into a buffer of its own
for that payload (written beforehand) and acknowledges; the get asks for them back and receives each
into written memory too. The pattern is a TransferQueue's: one acknowledged request per payload on put;
on get one request per payload, or with ``batched_get`` one request for all of them, answered back to
back (as one ``get_many`` asks a unit once). ``run_round(groups=...)`` puts several payloads per
acknowledged request instead (as a batching writer sends several Steps in one put). No framing beyond a 9-byte header, no authentication, no
checksums, no Python per chunk: whatever a socket transport adds, it cannot beat this on the same
machine in the same run.
"""

from __future__ import annotations

import multiprocessing
import socket
import struct
from typing import Any

import numpy as np

from dressage.tq.transport.landing import landing
from dressage_bench._systems import BenchSystem, SystemUnavailable, Workload, make_items
from dressage_bench._timing import RoundTiming, Stopwatch

__all__ = ["TcpLoopbackSystem"]

_HEAD = struct.Struct("<cQ")
_SOCK_BUF = 4 << 20


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, _SOCK_BUF)


def _recv_exact(sock: socket.socket, mv: memoryview) -> None:
    got = 0
    while got < len(mv):
        n = sock.recv_into(mv[got:])
        if not n:
            raise ConnectionError("peer closed")
        got += n


def _written(nbytes: int) -> np.ndarray:
    """A receive buffer placed as TransferQueue places its own (``tq/transport/landing.py``: where a
    buffer starts in its page moves the kernel's copy into it by up to 2x here) and written, so no timed
    round faults a page in."""
    buf = landing(nbytes)
    buf.fill(1)
    return buf


def _far_end(port: int) -> None:
    """The other process: one written buffer per payload; receives into one (P) or ``count`` of them
    from ``n`` on (M, the count in the next 8 bytes), acknowledging each request; sends one (G) or all
    of them back to back (B)."""
    sock = socket.create_connection(("127.0.0.1", port))
    _tune(sock)
    store: list[memoryview] = []
    head = bytearray(_HEAD.size)
    while True:
        _recv_exact(sock, memoryview(head))
        op, n = _HEAD.unpack(head)
        if op == b"A":  # allocate and write one more buffer, so no timed round faults a page
            store.append(memoryview(_written(n)))
            sock.sendall(b"k")
        elif op == b"F":
            store = []
            sock.sendall(b"k")
        elif op == b"P":
            _recv_exact(sock, store[n])
            sock.sendall(b"k")
        elif op == b"M":
            _recv_exact(sock, memoryview(head)[:8])
            for i in range(n, n + int.from_bytes(head[:8], "little")):
                _recv_exact(sock, store[i])
            sock.sendall(b"k")
        elif op == b"G":
            sock.sendall(store[n])
        elif op == b"B":
            for buf in store:
                sock.sendall(buf)
        else:
            sock.close()
            return


class TcpLoopbackSystem(BenchSystem):
    name = "tcp-loopback"
    across_processes = True

    def __init__(self, seed: int = 0, *, batched_get: bool = False) -> None:
        self._seed = seed
        self.batched_get = batched_get
        self._proc: Any = None
        self._sock: socket.socket | None = None
        self._src: list[np.ndarray] = []
        self._out: list[np.ndarray] = []
        self._ack = bytearray(1)

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(60)
        ctx = multiprocessing.get_context("spawn")
        self._proc = ctx.Process(target=_far_end, args=(listener.getsockname()[1],), daemon=True)
        self._proc.start()
        try:
            self._sock, _ = listener.accept()
        except OSError as exc:
            raise SystemUnavailable(f"tcp-loopback: the far end did not connect: {exc}") from exc
        finally:
            listener.close()
        self._sock.settimeout(None)
        _tune(self._sock)

    def _command(self, op: bytes, n: int) -> None:
        self._sock.sendall(_HEAD.pack(op, n))  # type: ignore[union-attr]

    def prepare(self, workload: Workload, sources: list[np.ndarray] | None = None) -> None:
        """The far end's buffers, one per payload; ``sources``: send these arrays (contiguous, one per
        payload) rather than the workload's own items."""
        arrays = sources if sources is not None else [a for item in make_items(workload, self._seed) for a in item]
        self._src = [a.reshape(-1).view(np.uint8) for a in arrays]
        self._out = [_written(a.nbytes) for a in self._src]
        for a in self._src:
            self._command(b"A", a.nbytes)
            _recv_exact(self._sock, memoryview(self._ack))  # type: ignore[arg-type]

    def run_round(self, workload: Workload, groups: list[int] | None = None) -> RoundTiming:
        """One put of every payload and one read back; ``groups``: that many payloads per put request
        (in order, summing to the payload count), else one each."""
        sock = self._sock
        ack = memoryview(self._ack)
        with Stopwatch() as put:
            if groups is None:
                for i, a in enumerate(self._src):
                    self._command(b"P", i)
                    sock.sendall(a)  # type: ignore[union-attr]
                    _recv_exact(sock, ack)  # type: ignore[arg-type]
            else:
                at = 0
                for k in groups:
                    sock.sendall(_HEAD.pack(b"M", at) + k.to_bytes(8, "little"))  # type: ignore[union-attr]
                    for a in self._src[at:at + k]:
                        sock.sendall(a)  # type: ignore[union-attr]
                    _recv_exact(sock, ack)  # type: ignore[arg-type]
                    at += k
        with Stopwatch() as get:
            if self.batched_get:
                self._command(b"B", len(self._out))
                for out in self._out:
                    _recv_exact(sock, memoryview(out))  # type: ignore[arg-type]
            else:
                for i, out in enumerate(self._out):
                    self._command(b"G", i)
                    _recv_exact(sock, memoryview(out))  # type: ignore[arg-type]
        return RoundTiming(put.seconds, get.seconds)

    def finish(self, workload: Workload) -> None:
        self._src, self._out = [], []
        if self._sock is not None:
            self._command(b"F", 0)
            _recv_exact(self._sock, memoryview(self._ack))

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._command(b"Q", 0)
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
            self._proc = None

    def describe(self) -> dict[str, object]:
        return {"path": "bench process -> second process -> bench process, plain TCP on loopback, "
                        "one written buffer per payload at both ends, no framing, MAC or checksums (the socket floor)",
                "get": "one request for every payload" if self.batched_get else "one request per payload"}
