"""Frame codec of every TransferQueue socket: msgpack control frame plus raw payload frames.

A message is ``[control, payload_0, ..., payload_n]``. The control frame is one version byte followed by
a msgpack map; payload frames are the raw bytes of C-contiguous numpy arrays whose dtype and shape the
control frame declares. Nothing is ever unpickled: msgpack extension types, pickle bytes, object dtypes
and versions other than ours are rejected with :class:`ProtocolError`. With a shared secret, a last
frame carries the sender's nonce, a sequence number, the time, a random salt and a GMAC tag over all
of it and every other frame, keyed once per message by HMAC-SHA256 of the secret and that header
(``sign`` / ``open_frames``); a :class:`ReplayGuard` accepts each message once.
Control values are bounded (:func:`uint`, :func:`text`, :func:`text_list`): no request can make a
counter or a reply overflow what msgpack can carry.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from collections.abc import Iterator
from typing import Any, NamedTuple, Sequence, TypeVar

import msgpack
import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dressage import errors
from dressage.errors import ProtocolError, TransferQueueError
from dressage.fields.refs import check_dtype, dtype_name, is_plain_dtype

T = TypeVar("T")

__all__ = [
    "VERSION", "is_plain_dtype", "encode", "decode_control", "check_dtype", "array_from_frame",
    "array_meta", "error_to_wire", "error_from_wire", "PICKLE_MAGIC", "MAC_BYTES", "sign", "verify_mac",
    "open_frames", "Auth", "ReplayGuard", "TRAILER_BYTES", "uint", "text", "text_list", "MAX_KEYS", "max_keys", "key_pages", "MAX_KEY_BYTES",
    "MAX_NBYTES", "FrameMac", "auth_head", "parse_head", "AUTH_HEAD_BYTES", "PayloadTag", "PayloadMac", "payload_key",
    "payload_bytes",
    "TAGGED_MIN_BYTES",
]

VERSION = 1
# Pickle protocols 2..5 start with 0x80 then the protocol number; name them in the error.
PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
_MAX_CONTROL = 16 * 1024 * 1024
MAC_BYTES = 16


def _buffer(frame: Any) -> memoryview:
    mv = memoryview(getattr(frame, "buffer", frame))
    if mv.nbytes == 0:  # an empty array of several axes (0 rows of R3): a zero in its shape cannot be cast
        return memoryview(b"")
    return mv.cast("B")


_TRAILER_HEAD = AUTH_HEAD_BYTES = 48   # nonce(16) seq(8) time_ms(8) salt(16), then the tag
TRAILER_BYTES = _TRAILER_HEAD + MAC_BYTES
_KEY_LABEL = b"dressage-tq-frame-key\x00"
_GMAC_IV = bytes(12)      # every key tags one message only (see FrameMac)
_STREAM_AFTER = 64 * 1024  # bytes a FrameMac holds before it streams them


@dataclass(frozen=True, slots=True)
class Auth:
    """Who sent an authenticated message and which of its messages this is."""

    nonce: bytes
    """16 random bytes chosen by the sender once (per client)."""
    seq: int
    """The sender's message counter: each (nonce, seq) is accepted once."""
    time_ms: int


class FrameMac:
    """The GMAC tag (AES-256-GCM over no plaintext, every fed byte as associated data) of one message, fed
    frame by frame (and each frame in pieces, as it streams).

    HMAC-SHA256 passes over every payload byte at ~1.8 GB/s, slower than the socket; Poly1305 ran at
    5-11 GB/s here, GHASH (carry-less multiply in hardware) at 16-20 GB/s, and each side of each hop makes
    one such pass over every payload byte. A GMAC key must never tag two messages: each key is
    HMAC-SHA256(secret, label, header), and every header carries 16 fresh random bytes, so no two messages
    (requests or replies) share a key, and the IV can stay fixed. A message's first ``_STREAM_AFTER``
    bytes are held and tagged in one call when that is all there is (a small control message then costs
    ~2 us, as Poly1305 did, instead of ~7 us to set up a stream); beyond that they are streamed.
    ``label`` separates the ZMQ sockets from the bulk stream: a message tagged for one never opens on the other.
    """

    __slots__ = ("_key", "_head", "_held", "_held_bytes", "_stream")

    def __init__(self, secret: bytes, head: bytes, label: bytes = _KEY_LABEL) -> None:
        self._head = head
        self._key = hmac.new(secret, label + head, hashlib.sha256).digest()
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._stream: Any = None

    def frame(self, nbytes: int) -> None:
        """Start a frame of ``nbytes`` (its length is tagged too, so frames cannot be re-split)."""
        self.update(nbytes.to_bytes(8, "little"))

    def update(self, data: Any) -> None:
        stream = self._stream
        if stream is not None:
            stream.authenticate_additional_data(data)
            return
        n = memoryview(data).nbytes
        if self._held_bytes + n <= _STREAM_AFTER:
            self._held.append(bytes(data))  # small: the caller may reuse its buffer before finalize
            self._held_bytes += n
            return
        stream = self._stream = Cipher(algorithms.AES(self._key), modes.GCM(_GMAC_IV)).encryptor()
        for piece in self._held:
            stream.authenticate_additional_data(piece)
        self._held = []
        stream.authenticate_additional_data(data)

    def finalize(self) -> bytes:
        self.update(self._head)
        if self._stream is None:  # no plaintext: the sealed output is the tag alone
            return AESGCM(self._key).encrypt(_GMAC_IV, b"", b"".join(self._held))
        self._stream.finalize()
        return self._stream.tag


_PAYLOAD_LABEL = b"dressage-tq-payload-key\x00"
# Payloads from this size up carry a tag of their own (see PayloadTag); smaller ones are tagged as part of
# their message, where a tag each would cost more to set up (~5 us) than hashing them.
TAGGED_MIN_BYTES = 256 * 1024


def payload_bytes(payload: Any) -> memoryview:
    """A payload (an array or any buffer) as a flat memoryview of its bytes."""
    mv = memoryview(payload)
    if mv.nbytes == 0:  # a memoryview with a zero in its shape cannot be cast
        return memoryview(b"")
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


def payload_key(secret: bytes, head: bytes) -> bytes:
    """The key of every payload tag of the message whose auth head is ``head`` (its own label: a payload
    key never tags a message, nor a message key a payload)."""
    return hmac.new(secret, _PAYLOAD_LABEL + head, hashlib.sha256).digest()


class PayloadTag(NamedTuple):
    """Who first sent a payload and what it was: the auth head of that message, the payload's index in
    it and its GMAC tag (:class:`PayloadMac`). A StorageUnit keeps it with the blob and sends it with the
    blob's bytes, so the reader checks the writer's tag end to end: bytes changed in the unit's memory or
    on either hop fail that check, and the unit reads none of them to answer a get."""

    head: bytes
    index: int
    tag: bytes

    RECORD = struct.Struct(f"<{AUTH_HEAD_BYTES}sI{MAC_BYTES}s")


class PayloadMac:
    """The tag of one payload, fed as it streams: AES-256-GCM over no plaintext with ``payload_key`` of
    the message that first carried it, that message's index of the payload as IV (each key tags the
    payloads of one message, each with an IV of its own) and the payload's length, then its bytes, as
    associated data."""

    __slots__ = ("_stream",)

    def __init__(self, key: bytes, index: int, nbytes: int) -> None:
        self._stream = Cipher(algorithms.AES(key), modes.GCM(index.to_bytes(12, "little"))).encryptor()
        self._stream.authenticate_additional_data(nbytes.to_bytes(8, "little"))

    def update(self, data: Any) -> None:
        self._stream.authenticate_additional_data(data)

    def finalize(self) -> bytes:
        self._stream.finalize()
        return self._stream.tag

    @classmethod
    def check(cls, secret: bytes, tag: PayloadTag, data: Any, piece: int = 1 << 20) -> bool:
        """Whether ``data`` (a buffer) is the payload ``tag`` was computed over."""
        mv = payload_bytes(data)
        mac = cls(payload_key(secret, tag.head), tag.index, mv.nbytes)
        for lo in range(0, mv.nbytes, piece):
            mac.update(mv[lo:lo + piece])
        return hmac.compare_digest(mac.finalize(), tag.tag)


def auth_head(nonce: bytes | None = None, seq: int = 1, time_ms: int | None = None) -> bytes:
    """``nonce, seq, time, salt``: the 48 bytes a tag's key is derived from."""
    nonce = os.urandom(16) if nonce is None else nonce
    t = int(time.time() * 1000) if time_ms is None else time_ms
    return nonce + struct.pack("<QQ", seq, t) + os.urandom(16)


def parse_head(head: bytes) -> Auth:
    seq, t = struct.unpack_from("<QQ", head, 16)
    return Auth(head[:16], seq, t)


def _mac(frames: Sequence[Any], secret: bytes, head: bytes) -> bytes:
    mac = FrameMac(secret, head)
    for frame in frames:
        buf = _buffer(frame) if not isinstance(frame, bytes) else frame
        mac.frame(len(buf))
        mac.update(buf)
    return mac.finalize()


def sign(frames: Sequence[Any], secret: bytes, *, nonce: bytes | None = None, seq: int = 1,
         time_ms: int | None = None) -> bytes:
    """The trailer frame of an authenticated message: ``nonce, seq, time, salt`` and a GMAC tag,
    under a key derived from the secret and those four, over every frame (each prefixed by its length,
    so frames cannot be re-split) and those four."""
    head = auth_head(nonce, seq, time_ms)
    return head + _mac(frames, secret, head)


def open_frames(frames: Sequence[Any], secret: bytes) -> tuple[list[Any], Auth]:
    """The frames without their trailer, and who sent them; ProtocolError when the trailer is
    missing or its MAC is wrong. The MAC is checked before anything else is read."""
    if len(frames) < 2:
        raise ProtocolError("unauthenticated frame rejected: this socket requires an authentication frame")
    body, tag = list(frames[:-1]), bytes(_buffer(frames[-1]))
    if len(tag) != TRAILER_BYTES or not hmac.compare_digest(
            _mac(body, secret, tag[:_TRAILER_HEAD]), tag[_TRAILER_HEAD:]):
        raise ProtocolError("unauthenticated frame rejected: the MAC does not match (wrong or no secret)")
    return body, parse_head(tag[:_TRAILER_HEAD])


def verify_mac(frames: Sequence[Any], secret: bytes) -> list[Any]:
    """The frames without their trailer, or ProtocolError (see :func:`open_frames`)."""
    return open_frames(frames, secret)[0]


class ReplayGuard:
    """Accepts each authenticated (nonce, seq) once: a message older than ``window_s`` (by its
    signed time) is refused, and per sender a sliding window of the last ``WINDOW`` sequence
    numbers remembers which were seen (messages from one sender may arrive slightly out of order).
    Senders quiet for longer than ``window_s`` are forgotten: their old messages fail the time check."""

    WINDOW = 1024

    def __init__(self, window_s: float = 300.0, max_senders: int = 100_000,
                 clock: Any = time.time) -> None:
        self.window_ms = int(window_s * 1000)
        self.max_senders = max_senders
        self._clock = clock
        self._senders: OrderedDict[bytes, list[int]] = OrderedDict()  # nonce -> [top seq, bitmap, last ms]
        self.replayed = 0

    def check(self, auth: Auth) -> None:
        now = int(self._clock() * 1000)
        if abs(now - auth.time_ms) > self.window_ms:
            self.replayed += 1
            raise ProtocolError(f"authenticated frame rejected: signed {abs(now - auth.time_ms) / 1000:.0f} s "
                                f"from this end's clock (window {self.window_ms / 1000:g} s): a replay or a skewed clock")
        st = self._senders.get(auth.nonce)
        if st is None:
            while self._senders and (len(self._senders) >= self.max_senders
                                     or now - next(iter(self._senders.values()))[2] > self.window_ms):
                self._senders.popitem(last=False)
            self._senders[auth.nonce] = [auth.seq, 1, now]
            return
        top, bits, _ = st
        if auth.seq > top:
            shift = auth.seq - top
            bits = ((bits << shift) | 1) & ((1 << self.WINDOW) - 1) if shift < self.WINDOW else 1
            top = auth.seq
        else:
            back = top - auth.seq
            if back >= self.WINDOW or bits >> back & 1:
                self.replayed += 1
                raise ProtocolError(f"authenticated frame rejected: message {auth.seq} of this sender was "
                                    "already accepted (a replay)")
            bits |= 1 << back
        st[:] = [top, bits, now]
        self._senders.move_to_end(auth.nonce)


def _no_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(f"msgpack extension type {code} is not accepted on TransferQueue sockets")


def encode(control: dict[str, Any], payloads: Sequence[Any] = ()) -> list[Any]:
    """Frames for ``send_multipart(..., copy=False)``; payload buffers are passed through uncopied."""
    head = bytes((VERSION,)) + msgpack.packb(control, use_bin_type=True)
    return [head, *payloads]


def decode_control(frame: Any) -> dict[str, Any]:
    """Parse a control frame (bytes, memoryview or zmq.Frame) or raise :class:`ProtocolError`."""
    buf = memoryview(getattr(frame, "buffer", frame)).cast("B")
    if len(buf) < 2:
        raise ProtocolError(f"control frame of {len(buf)} bytes is too short")
    if len(buf) > _MAX_CONTROL:
        raise ProtocolError(f"control frame of {len(buf)} bytes exceeds {_MAX_CONTROL}")
    if bytes(buf[:2]) in PICKLE_MAGIC:
        raise ProtocolError("pickle frame rejected: TransferQueue sockets accept only msgpack control frames")
    version = buf[0]
    if version != VERSION:
        raise ProtocolError(f"frame protocol version {version} is not supported (this end speaks {VERSION})")
    try:
        obj = msgpack.unpackb(buf[1:], raw=False, ext_hook=_no_ext, strict_map_key=True)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise ProtocolError(f"malformed msgpack control frame: {exc}") from exc
    if not isinstance(obj, dict):
        raise ProtocolError(f"control frame must be a map, got {type(obj).__name__}")
    return obj


def array_meta(array: np.ndarray) -> list[Any]:
    """``[dtype name, shape]`` of a native-endian array, as the control frame declares it."""
    return [dtype_name(array.dtype), list(array.shape)]


def array_from_frame(frame: Any, dtype_str: Any, shape: Any) -> np.ndarray:
    """A read-only array viewing ``frame``'s bytes (no copy); size is checked against the declared shape."""
    dtype = check_dtype(dtype_str)
    if not isinstance(shape, (list, tuple)) or not shape or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ProtocolError(f"bad shape {shape!r:.100}")
    expected = dtype.itemsize * math.prod(shape)
    if isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 1:
        # A received buffer (bulk stream): a view keeps the buffer as its base, so it can be pooled again.
        if frame.nbytes != expected:
            raise ProtocolError(f"payload of {frame.nbytes} bytes does not match {dtype.name}{list(shape)} "
                                f"({expected} bytes)")
        return frame.view(dtype).reshape(shape)
    buf = memoryview(getattr(frame, "buffer", frame)).cast("B")
    if len(buf) != expected:
        raise ProtocolError(f"payload of {len(buf)} bytes does not match {dtype.name}{list(shape)} ({expected} bytes)")
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


# Errors that may cross a socket by name; anything else arrives as TransferQueueError.
_WIRE_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        errors.TransferQueueError, errors.KeyNotFoundError, errors.RowRangeError,
        errors.StorageUnitUnavailable, errors.StorageFullError, errors.ProtocolError,
        errors.IntegrityError, errors.ConfigError,
    )
}


def error_to_wire(exc: BaseException) -> dict[str, Any]:
    name = type(exc).__name__ if type(exc).__name__ in _WIRE_ERRORS else "TransferQueueError"
    if not isinstance(exc, TransferQueueError) and name == "TransferQueueError":
        message = f"{type(exc).__name__}: {exc}"
    else:
        message = str(exc)
    return {"ok": False, "error": name, "message": message}


def error_from_wire(control: dict[str, Any], where: str) -> Exception:
    cls = _WIRE_ERRORS.get(str(control.get("error")), TransferQueueError)
    return cls(f"{control.get('message', 'unknown error')} [{where}]")


# Per-request bounds on control values: every count, size and name a peer sends is checked with these.
MAX_KEYS = 100_000
MAX_KEY_BYTES = 1024
MAX_TEXT = 4096
MAX_NBYTES = 1 << 48          # one blob; far above any unit's budget, far below a 64-bit overflow


def max_keys() -> int:
    """The per-request key bound, read at call time: both ends of a call check and page by this one value."""
    return MAX_KEYS


def key_pages(items: Sequence[T], size: int | None = None) -> Iterator[Sequence[T]]:
    """``items`` in consecutive pages of at most ``size`` (default :func:`max_keys`), so a call that carries
    keys never carries more than one request may; nothing for no items."""
    step = max(1, max_keys() if size is None else int(size))
    for at in range(0, len(items), step):
        yield items[at:at + step]


def uint(value: Any, what: str, hi: int) -> int:
    """An integer in ``[0, hi]`` (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise ProtocolError(f"{what!r} must be an integer in [0, {hi}], got {value!r:.40}")
    return value


def text(value: Any, what: str, *, max_len: int = MAX_TEXT, optional: bool = False, empty: bool = True) -> Any:
    """A string of at most ``max_len`` characters (or None when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > max_len or (not empty and not value):
        raise ProtocolError(f"{what!r} must be a {'non-empty ' if not empty else ''}string of at most "
                            f"{max_len} characters{' or null' if optional else ''}, got {value!r:.60}")
    return value


def text_list(value: Any, what: str, *, max_items: int | None = None, max_len: int = MAX_KEY_BYTES) -> list[str]:
    """A list of at most ``max_items`` (default :func:`max_keys`) non-empty strings of at most ``max_len``
    characters."""
    if max_items is None:
        max_items = max_keys()
    if not isinstance(value, list) or len(value) > max_items:
        raise ProtocolError(f"{what!r} must be a list of at most {max_items} strings")
    for v in value:
        if not isinstance(v, str) or not v or len(v) > max_len:
            raise ProtocolError(f"{what!r} must hold non-empty strings of at most {max_len} characters, got {v!r:.60}")
    return value
