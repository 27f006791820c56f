"""The R3 routing decoder: base64 text in, ``[rows, num_layers, topk]`` ids in the storage dtype out.

The engine sends ``meta_info.routed_experts`` as one base64 string of int32 ids, about 1.7 KiB of
text per token for a 40-layer, top-8 model. :class:`RoutedExpertsStream` takes that text in pieces
as it arrives (the JSON string's content, without its quotes) and keeps only the ids in the storage
dtype the Proxy records (``uint8`` is a sixteenth of the text), so neither the whole string nor an
int32 copy of the rows is ever held. A string already read whole is the same stream with one last
piece (:func:`decode_routed_experts_string`): there is one decoder.

The plainest text (alphabet characters, padding only in the last four) is decoded as it comes.
Anything else makes the stream give up decoding (:attr:`gave_up`) and keep the characters, which
:meth:`finish` hands to ``binascii``'s strict decoder, so every error (characters outside the
base64 alphabet, misplaced padding, a length that is no whole group) is worded as ``binascii``
words it; :meth:`text` gives back the exact characters fed so far. Ids out of range for the storage
dtype, or a wire dtype other than int32 (``meta_info.routed_experts_dtype``, read only after the
string), are no reason to give up: the decoded bytes are then kept, or rebuilt exactly from the
ids, and :meth:`finish` checks them as a whole, with the range check's own error.
"""

from __future__ import annotations

import base64
import binascii
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from dressage.errors import WireFormatError
from dressage.fields.b64 import b64decode_quads, b64decode_strict
from dressage.fields.models import ModelSpec
from dressage.fields.r3 import check_row_bytes, encode_routed_experts, max_expert_id, r3_dtype

__all__ = ["RoutedExpertsSpec", "RoutedExpertsStream", "STREAM_WINDOW", "WIRE_DTYPES", "decode_routed_experts_string"]

STREAM_WINDOW = 128 * 1024
"""Characters gathered before a decode step: the text a stream holds at most, besides one piece."""

WIRE_DTYPES = {"int32": np.int32, "uint8": np.uint8, "uint16": np.uint16, "int16": np.int16, "int64": np.int64}
"""The integer dtypes ``meta_info.routed_experts_dtype`` may name (int32 when absent)."""


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


def check_wire_dtype(dtype: str) -> None:
    """:class:`WireFormatError` unless ``dtype`` is one of :data:`WIRE_DTYPES`."""
    if dtype not in WIRE_DTYPES:
        raise WireFormatError(f"routed_experts_dtype {dtype!r} is not a known integer dtype")


def _strict_b64(text: Any) -> Any:
    """``binascii``'s strict decode of the whole text, its refusal as :class:`WireFormatError`."""
    try:
        return b64decode_strict(text)
    except (binascii.Error, ValueError) as exc:
        raise WireFormatError(f"routed_experts is not valid base64: {exc}") from exc


def _routed_from_raw(raw: Any, spec: RoutedExpertsSpec, dtype: str, checked: bool) -> np.ndarray:
    """Decoded wire bytes as ``[rows, num_layers, topk]``: whole rows, then range-checked into the
    storage dtype (``checked``) or an int32 copy."""
    wire = np.dtype(WIRE_DTYPES[dtype])
    check_row_bytes(len(raw), spec.num_layers, spec.topk, wire.itemsize)
    arr = np.frombuffer(raw, dtype=wire).reshape(-1, spec.num_layers, spec.topk)
    if checked:
        return encode_routed_experts(arr, spec.storage_dtype, num_experts=spec.num_experts)
    return arr.astype(np.int32)


def decode_routed_experts_string(text: str | bytes, spec: RoutedExpertsSpec, dtype: str = "int32", *,
                          checked: bool = True) -> np.ndarray:
    """A routing string read whole: the stream fed it as its one last piece, then finished.

    ``dtype`` is the wire dtype (``meta_info.routed_experts_dtype``). With ``checked`` the result
    is range-checked into ``spec.storage_dtype``; without, it is an int32 copy of the wire ids.
    """
    check_wire_dtype(dtype)
    if isinstance(text, str):
        if not text.isascii():
            _strict_b64(text)  # raises: binascii words a str that is not ASCII its own way
        text = text.encode("ascii")
    elif not isinstance(text, bytes):
        raise WireFormatError(f"routed_experts must be a base64 string, got {type(text).__name__}")
    stream = RoutedExpertsStream(spec)
    stream.end(text)
    return stream.finish(dtype, checked=checked)


class RoutedExpertsStream:
    """The decoder of one answer's routing string: :meth:`feed` its characters, :meth:`end` (with the
    last piece, or the whole string), then :meth:`finish`; :meth:`text` gives the characters back."""

    __slots__ = ("spec", "_dtype", "_high", "_pending", "_ids", "_carry", "_raw", "_text", "_ended", "_tail")

    def __init__(self, spec: RoutedExpertsSpec) -> None:
        self.spec = spec
        self._dtype, self._high = _limits(spec.storage_dtype, spec.num_experts)
        self._pending = bytearray()       # characters not decoded yet
        # The ids so far in the storage dtype (int32 on the wire): the first decode step's array as it
        # is (a string decoded in one step is never copied), a bytearray once a second step adds to it.
        self._ids: bytearray | np.ndarray = bytearray()
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

    def end(self, last: bytes | bytearray | memoryview = b"") -> None:
        """The string is complete once ``last`` is added: decode the rest, its last four characters
        (padding) included. With nothing pending, ``last`` is decoded where it lies (no copy)."""
        if self._ended:
            return
        self._ended = True
        if self._text is not None:
            self._text += last
            return
        if self._pending:
            self._pending += last
            rest: Any = self._pending
        else:
            rest = last if type(last) is bytes else bytes(last)
        if not rest:
            return
        try:
            # binascii's strict decoder, or a faster one that answers alike: misplaced padding, a
            # length that is no whole group or a character outside the alphabet is refused.
            raw = b64decode_strict(rest)
        except (binascii.Error, ValueError):
            self._pending = rest if rest is self._pending else bytearray(rest)
            self._give_up()
            return
        self._pending = bytearray()
        self._tail = bytes(rest[-4:])
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

    def _take(self, raw: Any) -> None:
        if isinstance(raw, np.ndarray):
            raw = memoryview(raw)  # as bytes: ``+=`` onto a bytearray must append, not add elementwise
        if self._raw is not None:
            self._raw += raw
            return
        buf = self._carry + bytes(raw) if self._carry else raw
        whole = len(buf) // 4 * 4
        self._carry = bytes(buf[whole:])
        if not whole:
            return
        vals = np.frombuffer(buf, dtype="<i4", count=whole // 4)
        # One pass: a negative id read as unsigned is above every limit.
        if int(vals.view("<u4").max()) > self._high:
            self._raw = bytearray(self._decoded_ids_raw())
            self._raw += buf
            self._ids = bytearray()
            self._carry = b""
            return
        ids = vals if self._dtype == np.int32 else vals.astype(self._dtype)
        if isinstance(self._ids, np.ndarray):
            self._ids = bytearray(memoryview(self._ids).cast("B"))
        if len(self._ids):
            self._ids += memoryview(ids).cast("B")
        else:
            self._ids = ids

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
        self._ids = bytearray()
        self._raw = None
        self._carry = b""

    def text(self) -> bytes:
        """The characters fed so far, exactly (what was decoded is encoded again: base64 of whole
        groups is one to one)."""
        if self._text is not None:
            return bytes(self._text)
        raw = self.raw()
        if self._tail:  # padding may hide set bits that decoding dropped: the characters as they came
            return base64.b64encode(bytes(raw)[:len(raw) - (3 - self._tail.count(b"="))]) + self._tail
        return base64.b64encode(raw) + bytes(self._pending)

    def finish(self, dtype: str = "int32", *, checked: bool = True) -> np.ndarray:
        """The ended string's ``[rows, num_layers, topk]`` ids, ``dtype`` being its wire dtype.

        With ``checked``: range-checked (:class:`~dressage.errors.ExpertIdRangeError`) into the
        spec's storage dtype, a read-only array when that is int32 (a view of the decoded bytes).
        Without: an int32 copy of the wire ids, not range-checked. Text that is not plain base64
        raises :class:`WireFormatError` with ``binascii``'s words; bytes that are not whole rows,
        :class:`~dressage.errors.FieldShapeError`.
        """
        if not self._ended:
            raise RuntimeError("finish() needs a stream that ended")
        check_wire_dtype(dtype)
        spec = self.spec
        if self._text is not None:
            return _routed_from_raw(_strict_b64(self._text), spec, dtype, checked)
        if self._raw is not None or dtype != "int32" or not checked:
            return _routed_from_raw(bytes(self.raw()), spec, dtype, checked)
        wire_bytes = memoryview(self._ids).nbytes // self._dtype.itemsize * 4 + len(self._carry)  # int32 ids
        check_row_bytes(wire_bytes, spec.num_layers, spec.topk, 4)
        out = np.frombuffer(self._ids, dtype=self._dtype).reshape(-1, spec.num_layers, spec.topk)
        if self._dtype == np.int32:
            out.flags.writeable = False  # a view of the decoded bytes, as every int32 answer is
        return out
