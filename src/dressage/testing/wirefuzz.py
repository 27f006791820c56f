"""Hostile frames for TransferQueue sockets, and a driver that throws them at a running server.

``hostile_message(rng)`` builds one bad multipart message (random bytes, truncated or oversized frames,
wrong versions, pickles, ill-typed msgpack, frame-count lies, forged MACs). ``fuzz_server`` sends many and
checks that each gets a typed error reply (or a correct answer, for the rare valid one) and that valid
requests still work afterwards. A message with a frame over the socket's ``ZMQ_MAXMSGSIZE`` is the one
exception the protocol makes: libzmq drops the sender's connection while reading it, so it never reaches
the server and cannot be answered; given that limit, the driver requires the drop instead of a reply. Point it at any server that speaks the TransferQueue wire protocol (a
StorageUnit or Controller of another backend, too); ``dressage bench faults`` (``wire_fuzz``) uses it.
"""

from __future__ import annotations

import pickle
from dataclasses import asdict, dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq

from dressage.errors import ProtocolError
from dressage.tq.transport import wire

__all__ = ["hostile_message", "decode_untyped", "fuzz_server", "FuzzReport", "KINDS"]

KINDS = ("random", "truncated", "oversized", "version", "pickle", "typed_garbage", "frame_count",
         "nested", "ext", "forged_mac", "empty")
_TYPED = {"TransferQueueError", "KeyNotFoundError", "RowRangeError", "StorageUnitUnavailable",
          "StorageFullError", "ProtocolError", "IntegrityError", "ConfigError"}


def _valid(rng: np.random.Generator) -> list[bytes]:
    """A well-formed request to mutate (put, get, delete, info...)."""
    op = str(rng.choice(["put", "get", "delete", "exists", "info", "list", "stats", "ping", "place", "where"]))
    if op == "put":
        n = int(rng.integers(1, 64))
        return wire.encode({"op": op, "id": 1, "items": [["fz", "uint8", [n]]]}, [bytes(n)])
    if op == "get":
        return wire.encode({"op": op, "id": 1, "reqs": [["fz", 0, None]]})
    if op == "place":
        return wire.encode({"op": op, "id": 1, "items": [["fz", 8, "f"]]})
    return wire.encode({"op": op, "id": 1, "key": "fz", "keys": ["fz"]})


def _garbage_value(rng: np.random.Generator, depth: int = 0) -> Any:
    pick = int(rng.integers(0, 11 if depth < 3 else 7))
    return [
        lambda: None, lambda: True, lambda: int(rng.integers(-2**62, 2**62)), lambda: float(rng.normal()),
        lambda: "x" * int(rng.integers(0, 40)), lambda: bytes(rng.integers(0, 256, int(rng.integers(0, 40)), np.uint8)),
        lambda: 2**64 - 1,
        lambda: [_garbage_value(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))],
        lambda: {str(i): _garbage_value(rng, depth + 1) for i in range(int(rng.integers(0, 4)))},
        lambda: [["k", "float32", [-1]]], lambda: [["k", "object", [2**40, 2**40]]],
    ][pick]()


def hostile_message(rng: np.random.Generator, kind: str | None = None,
                    secret: bytes | None = None) -> tuple[str, list[bytes]]:
    """``(kind, frames)``: one message no correct server may crash, hang or answer untyped on."""
    kind = kind or str(rng.choice(KINDS))
    if kind == "random":
        frames = [bytes(rng.integers(0, 256, int(rng.integers(0, 512)), np.uint8))
                  for _ in range(int(rng.integers(1, 4)))]
    elif kind == "truncated":
        frames = _valid(rng)
        i = int(rng.integers(0, len(frames)))
        frames[i] = frames[i][: int(rng.integers(0, max(len(frames[i]), 1)))]
    elif kind == "oversized":
        frames = _valid(rng)
        if rng.random() < 0.05:  # a control frame past the decoder's limit (rarely: it is 16 MiB)
            frames[0] = bytes((wire.VERSION,)) + b"\x00" * (16 * 1024 * 1024 + 8)
        else:  # a payload larger than its declared shape
            frames = wire.encode({"op": "put", "id": 1, "items": [["fz", "uint8", [4]]]},
                                 [bytes(int(rng.integers(5, 1 << 16)))])
    elif kind == "version":
        frames = _valid(rng)
        frames[0] = bytes((int(rng.choice([0, 2, 3, 127, 255])),)) + frames[0][1:]
    elif kind == "pickle":
        obj = {"op": "put", "id": 1, "items": [["evil", "object", [1]]]}
        if rng.random() < 0.5:
            frames = [pickle.dumps(obj, protocol=int(rng.integers(2, 6)))]
        else:
            frames = wire.encode(obj, [pickle.dumps(np.array([1, 2], dtype=object))])
    elif kind == "typed_garbage":
        control = {"op": str(rng.choice(["put", "get", "delete", "info", "exists", "place", "commit", "abort",
                                         "add_unit", "unit_state", "clear", "set_batch", "state", "touch"])), "id": 1}
        for name in rng.choice(["items", "reqs", "keys", "key", "batch", "unit", "unit_id", "state", "shm"],
                               size=int(rng.integers(1, 4))):
            control[str(name)] = _garbage_value(rng)
        frames = wire.encode(control, [bytes(int(rng.integers(0, 16))) for _ in range(int(rng.integers(0, 3)))])
    elif kind == "frame_count":
        frames = wire.encode({"op": "put", "id": 1, "items": [["a", "uint8", [2]], ["b", "uint8", [2]]]},
                             [b"\x00\x00"] * int(rng.choice([0, 1, 3, 5])))
    elif kind == "nested":
        depth = int(rng.integers(100, 5000))
        frames = [bytes((wire.VERSION,)) + b"\x91" * depth + b"\xc0"]
    elif kind == "ext":
        frames = [bytes((wire.VERSION,)) + msgpack.packb({"op": msgpack.ExtType(int(rng.integers(0, 128)), b"x")})]
    elif kind == "forged_mac":
        frames = _valid(rng) + [bytes(rng.integers(0, 256, int(rng.choice([0, 16, 32, 64])), np.uint8))]
    else:
        frames = [b""]
    if secret is not None and kind != "forged_mac" and rng.random() < 0.5:
        frames = frames + [wire.sign(frames, secret)]  # authentic, and still malformed inside
    return kind, frames


def decode_untyped(frames: list[bytes]) -> bool:
    """Feed one message to the decoders; True if any raised something other than ProtocolError."""
    try:
        control = wire.decode_control(frames[0] if frames else b"")
        items = control.get("items")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, list) and len(item) >= 3 and len(frames) > 1:
                wire.array_from_frame(frames[1], item[1], item[2])
    except ProtocolError:
        pass
    except Exception:
        return True
    return False


@dataclass(slots=True)
class FuzzReport:
    wire_inputs: int = 0
    wire_untyped_errors: int = 0     # replies of an untyped error, decoder escapes, or server-side counts
    wire_no_reply: int = 0           # messages the server neither answered nor dropped (a hang)
    wire_dropped: int = 0            # over-limit messages whose connection libzmq closed, as it must
    wire_ok_replies: int = 0         # accidentally valid requests, answered correctly
    decoder_inputs: int = 0
    valid_after: bool = False        # a valid request still worked after every batch
    by_kind: dict[str, int] = field(default_factory=dict)
    errors_seen: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _connect(ctx: zmq.Context, address: str, watch: bool) -> tuple[zmq.Socket, zmq.Socket | None]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED) if watch else None
    sock.connect(address)
    return sock, monitor


def _close(sock: zmq.Socket, monitor: zmq.Socket | None) -> None:
    if monitor is not None:
        sock.disable_monitor()
        monitor.close(0)
    sock.close(0)


def _wait(sock: zmq.Socket, monitor: zmq.Socket | None, timeout_s: float) -> str:
    """"reply", "dropped" (the server closed this connection) or "silent" within ``timeout_s``."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    if monitor is not None:
        poller.register(monitor, zmq.POLLIN)
    ready = dict(poller.poll(int(timeout_s * 1000)))
    if sock in ready:
        return "reply"
    return "dropped" if monitor is not None and monitor in ready else "silent"


def fuzz_server(address: str, n: int, *, seed: int = 0, secret: bytes | None = None,
                check_valid: Any = None, untyped_counter: Any = None, timeout_s: float = 5.0,
                max_frame_bytes: int | None = None) -> FuzzReport:
    """Send ``n`` hostile messages to ``address``; ``check_valid()`` (every 25) must keep succeeding.
    ``untyped_counter()`` reads the server's count of handler failures that were not typed errors (a
    typed-looking reply can hide one: the server wraps any exception as TransferQueueError).
    ``max_frame_bytes`` is the socket's ``ZMQ_MAXMSGSIZE`` (libzmq applies it to each frame): a message
    with a larger frame is never delivered to the server, whose libzmq closes the connection instead;
    that drop, seen on the fuzzer's socket, is its correct answer (``wire_dropped``). Without the limit,
    or for any other message, silence is a hang (``wire_no_reply``)."""
    rng = np.random.default_rng(seed)
    untyped_before = untyped_counter() if untyped_counter is not None else 0
    report = FuzzReport()
    ctx = zmq.Context.instance()
    watch = max_frame_bytes is not None
    sock, monitor = _connect(ctx, address, watch)
    valid_ok = True
    try:
        for i in range(n):
            kind, frames = hostile_message(rng, secret=secret)
            report.by_kind[kind] = report.by_kind.get(kind, 0) + 1
            report.decoder_inputs += 1
            if decode_untyped(frames):
                report.wire_untyped_errors += 1
            over = watch and max(len(f) for f in frames) > max_frame_bytes  # type: ignore[operator]
            sock.send_multipart(frames)
            report.wire_inputs += 1
            outcome = _wait(sock, monitor if over else None, timeout_s)
            if outcome != "reply":
                if outcome == "dropped":
                    report.wire_dropped += 1
                else:
                    report.wire_no_reply += 1
                _close(sock, monitor)  # a late reply must not be read as the next one's
                sock, monitor = _connect(ctx, address, watch)
                continue
            reply = sock.recv_multipart()
            if secret is not None:
                try:
                    reply = wire.verify_mac(reply, secret)
                except ProtocolError:
                    report.wire_untyped_errors += 1  # the server must sign even its refusals
                    continue
            control = wire.decode_control(reply[0])
            if control.get("ok"):
                report.wire_ok_replies += 1
            else:
                name = str(control.get("error"))
                report.errors_seen[name] = report.errors_seen.get(name, 0) + 1
                if name not in _TYPED:
                    report.wire_untyped_errors += 1
            if check_valid is not None and i % 25 == 24:
                try:
                    check_valid()
                except Exception:
                    valid_ok = False
        if check_valid is not None:
            try:
                check_valid()
            except Exception:
                valid_ok = False
    finally:
        _close(sock, monitor)
    report.valid_after = valid_ok
    if untyped_counter is not None:
        report.wire_untyped_errors += untyped_counter() - untyped_before
    return report
