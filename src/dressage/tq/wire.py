"""Frame codec of every TransferQueue socket: msgpack control frame plus raw payload frames.

A message is ``[control, payload_0, ..., payload_n]``. The control frame is one version byte followed by
a msgpack map; payload frames are the raw bytes of C-contiguous numpy arrays whose dtype and shape the
control frame declares. Nothing is ever unpickled: msgpack extension types, pickle bytes, object dtypes
and versions other than ours are rejected with :class:`ProtocolError`. With a shared secret, a last
frame carries an HMAC-SHA256 over every other frame (``sign`` / ``verify_mac``).
"""

from __future__ import annotations

import hashlib
import hmac
import math
from typing import Any, Sequence

import msgpack
import numpy as np

from dressage import errors
from dressage.errors import ProtocolError, TransferQueueError

__all__ = [
    "VERSION", "dtype_name", "is_plain_dtype", "encode", "decode_control", "check_dtype", "array_from_frame",
    "array_meta", "error_to_wire", "error_from_wire", "PICKLE_MAGIC", "MAC_BYTES", "sign", "verify_mac",
]

VERSION = 1
# Pickle protocols 2..5 start with 0x80 then the protocol number; name them in the error.
PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
# numpy kinds that are plain bytes: bool, signed, unsigned, float, complex.
_PLAIN_KINDS = frozenset("biufc")
_MAX_CONTROL = 16 * 1024 * 1024
MAC_BYTES = 32


def _buffer(frame: Any) -> memoryview:
    return memoryview(getattr(frame, "buffer", frame)).cast("B")


def sign(frames: Sequence[Any], secret: bytes) -> bytes:
    """HMAC-SHA256 over the frames, each prefixed by its length (so frames cannot be re-split)."""
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for frame in frames:
        buf = _buffer(frame) if not isinstance(frame, bytes) else frame
        mac.update(len(buf).to_bytes(8, "little"))
        mac.update(buf)
    return mac.digest()


def verify_mac(frames: Sequence[Any], secret: bytes) -> list[Any]:
    """The frames without their trailing MAC, or ProtocolError when the MAC is missing or wrong."""
    if len(frames) < 2:
        raise ProtocolError("unauthenticated frame rejected: this socket requires an HMAC-SHA256 frame")
    body, tag = list(frames[:-1]), _buffer(frames[-1])
    if len(tag) != MAC_BYTES or not hmac.compare_digest(sign(body, secret), bytes(tag)):
        raise ProtocolError("unauthenticated frame rejected: HMAC-SHA256 does not match (wrong or no secret)")
    return body


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


_NAMES: dict[np.dtype, str] = {}


def dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, cached: numpy computes it in Python on every access (several microseconds)."""
    try:
        return _NAMES[dtype]
    except KeyError:
        name = _NAMES[dtype] = dtype.name
        return name


def is_plain_dtype(dtype: np.dtype) -> bool:
    return dtype.kind in _PLAIN_KINDS and dtype.fields is None and dtype.subdtype is None


def check_dtype(name: Any) -> np.dtype:
    """A plain numeric dtype from its name; object, structured and void dtypes are refused."""
    if not isinstance(name, str):
        raise ProtocolError(f"dtype must be a name string, got {type(name).__name__}")
    try:
        dtype = np.dtype(name)
    except Exception as exc:  # numpy raises TypeError, ValueError or SyntaxError, by the string's shape
        raise ProtocolError(f"unknown dtype {name!r:.100}") from exc
    if not is_plain_dtype(dtype):
        raise ProtocolError(f"dtype {name!r} is not a plain numeric dtype")
    return dtype


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
    buf = memoryview(getattr(frame, "buffer", frame)).cast("B")
    expected = dtype.itemsize * math.prod(shape)
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
