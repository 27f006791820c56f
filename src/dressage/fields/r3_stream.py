"""R3 routing decoded as its base64 text arrives: straight into the storage dtype, range-checked.

The engine sends ``meta_info.routed_experts`` as one base64 string of int32 ids, about 1.7 KiB of
text per token for a 40-layer, top-8 model. :class:`RoutedExpertsStream` takes that text in pieces
(the JSON string's content, without its quotes) and keeps only the ids in the storage dtype the
Proxy records (``uint8`` is a sixteenth of the text), so neither the whole string nor an int32 copy
of the rows is ever held.

It decodes only the plainest text and gives up on anything else, so that the caller decodes the
original string the usual way (:func:`dressage.fields.sglang.decode_routed_experts_b64`) and every
error is that path's own: characters outside the base64 alphabet (whitespace and JSON escapes
included) or padding anywhere but in the last four characters make it give up (:attr:`gave_up`;
:meth:`text` then returns the exact characters fed so far, rebuilt from what was decoded). Ids out
of range for the storage dtype, or a wire dtype other than int32 (``meta_info.routed_experts_dtype``,
read only after the string), are no reason to give up: the decoded bytes are then kept, or rebuilt
exactly from the ids, and checked by the usual path at :meth:`finish`, with its errors.
"""

from __future__ import annotations

import base64
import binascii
import functools
from dataclasses import dataclass

import numpy as np

from dressage.fields.b64 import b64decode_quads
from dressage.fields.models import ModelSpec
from dressage.fields.r3 import check_row_bytes, max_expert_id, r3_dtype

__all__ = ["RoutedExpertsSpec", "RoutedExpertsStream", "STREAM_WINDOW"]

STREAM_WINDOW = 128 * 1024
"""Characters gathered before a decode step: the text a stream holds at most, besides one piece."""


@dataclass(frozen=True, slots=True)
class RoutedExpertsSpec:
    """What a call's routing decodes into: the model's shape, the storage dtype and the expert count."""

    num_layers: int
    topk: int
    storage_dtype: str = "int32"
    num_experts: int | None = None

    def __post_init__(self) -> None:
        r3_dtype(self.storage_dtype)  # ConfigError for an unknown name

    @classmethod
    @functools.lru_cache(maxsize=16)
    def of(cls, model: ModelSpec, storage_dtype: str) -> "RoutedExpertsSpec":
        """The spec of a :class:`~dressage.fields.ModelSpec` stored as ``storage_dtype`` (one per pair)."""
        return cls(model.num_layers, model.topk, storage_dtype, model.num_experts)


@functools.lru_cache(maxsize=64)
def _limits(storage_dtype: str, num_experts: int | None) -> tuple[np.dtype, int]:
    """The storage dtype and the largest id it takes (bounded by the expert count when given)."""
    dtype = r3_dtype(storage_dtype)
    high = max_expert_id(storage_dtype)
    if num_experts is not None:
        high = min(high, int(num_experts) - 1)
    return dtype, high


class RoutedExpertsStream:
    """The decoder of one answer's routing string; :meth:`feed` its characters, :meth:`end`, then
    :meth:`finish` (through :func:`decode_routed_experts_b64`) or, when :attr:`gave_up`, :meth:`text`."""

    __slots__ = ("spec", "_dtype", "_high", "_pending", "_ids", "_carry", "_raw", "_text", "_ended", "_tail")

    def __init__(self, spec: RoutedExpertsSpec) -> None:
        self.spec = spec
        self._dtype, self._high = _limits(spec.storage_dtype, spec.num_experts)
        self._pending = bytearray()       # characters not decoded yet
        self._ids: bytearray | None = bytearray()  # the ids so far, in the storage dtype (int32 on the wire)
        self._carry = b""                 # decoded bytes short of one int32
        self._raw: bytearray | None = None  # the decoded bytes, once an id was out of range
        self._text: bytearray | None = None  # the characters, once the text was not plain base64
        self._ended = False
        self._tail = b""                  # the last four characters, once decoded (their bits may differ)

    @property
    def gave_up(self) -> bool:
        return self._text is not None

    def feed(self, chars: bytes | bytearray | memoryview) -> None:
        if self._text is not None:
            self._text += chars
            return
        self._pending += chars
        if len(self._pending) >= STREAM_WINDOW:
            self._drain()

    def end(self) -> None:
        """The string is complete: decode the rest, its last four characters (padding) included."""
        if self._ended:
            return
        self._ended = True
        if self._text is not None or not self._pending:
            return
        self._drain()
        if self._text is not None:
            return
        tail = bytes(self._pending)  # 1..4 characters
        if len(tail) != 4 or tail.startswith(b"="):
            self._give_up()
            return
        try:
            raw = binascii.a2b_base64(tail, strict_mode=True)
        except (binascii.Error, ValueError):
            self._give_up()
            return
        self._pending.clear()
        self._tail = tail
        self._take(raw)

    def _drain(self) -> None:
        """Decode every whole group of four characters but the last one or more characters."""
        n = (len(self._pending) - 1) // 4 * 4
        if n <= 0:
            return
        part = memoryview(self._pending)[:n]
        try:
            if self._pending.find(b"=", 0, n) != -1:
                raise binascii.Error("padding before the end")
            raw = b64decode_quads(part)
        except (binascii.Error, ValueError):
            part.release()
            self._give_up()
            return
        part.release()
        del self._pending[:n]
        self._take(raw)

    def _take(self, raw: bytes) -> None:
        if self._raw is not None:
            self._raw += raw
            return
        buf = self._carry + raw if self._carry else raw
        whole = len(buf) // 4 * 4
        self._carry = buf[whole:]
        if not whole:
            return
        vals = np.frombuffer(buf, dtype="<i4", count=whole // 4)
        # One pass: a negative id read as unsigned is above every limit.
        if int(vals.view("<u4").max()) > self._high:
            self._raw = bytearray(self._decoded_ids_raw())
            self._raw += buf
            self._ids = None
            self._carry = b""
            return
        self._ids += memoryview(vals if self._dtype == np.int32 else vals.astype(self._dtype))

    def _decoded_ids_raw(self) -> bytes:
        """The wire bytes of the ids decoded so far (int32, little-endian), not counting the carry."""
        return np.frombuffer(self._ids, dtype=self._dtype).astype("<i4").tobytes()

    def raw(self) -> bytes | bytearray:
        """Every byte decoded so far, exactly as the wire's base64 held it."""
        if self._raw is not None:
            return self._raw
        return self._decoded_ids_raw() + self._carry

    def _give_up(self) -> None:
        self._text = bytearray(base64.b64encode(self.raw()))
        self._text += self._pending
        self._pending = bytearray()
        self._ids = self._raw = None
        self._carry = b""

    def text(self) -> bytes:
        """The characters fed so far, exactly (what was decoded is encoded again: base64 of whole
        groups is one to one)."""
        if self._text is not None:
            return bytes(self._text)
        raw = self.raw()
        if self._tail:  # padding may hide set bits that decoding dropped: the characters as they came
            return base64.b64encode(bytes(raw)[:len(raw) - len(binascii.a2b_base64(self._tail))]) + self._tail
        return base64.b64encode(raw) + bytes(self._pending)

    def finish(self, num_layers: int, topk: int, dtype: str, storage_dtype: str | None,
               num_experts: int | None, decode_raw) -> np.ndarray:
        """The ``[rows, num_layers, topk]`` array, or the error, that decoding the whole string with
        these arguments gives; ``decode_raw(raw, ...)`` is that path from the decoded bytes on."""
        if self._text is not None or not self._ended:
            raise RuntimeError("finish() needs a stream that ended without giving up")
        if (self._raw is not None or dtype != "int32" or storage_dtype != self.spec.storage_dtype
                or num_experts != self.spec.num_experts):
            return decode_raw(bytes(self.raw()), num_layers, topk, dtype, storage_dtype, num_experts)
        wire_bytes = len(self._ids) // self._dtype.itemsize * 4 + len(self._carry)  # int32 on the wire
        check_row_bytes(wire_bytes, num_layers, topk, 4)
        out = np.frombuffer(self._ids, dtype=self._dtype).reshape(-1, num_layers, topk)
        if self._dtype == np.int32:
            out.flags.writeable = False  # as the plain path's view of the decoded bytes
        return out
