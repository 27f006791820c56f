"""FieldRef: the small reference that travels in place of a large field's array.

A ref names one stored blob (key, StorageUnit, field, stored dtype, full stored shape) and the rows of
that blob it covers. Segments narrow refs instead of slicing arrays, so they never read TQ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dressage.errors import IntegrityError, ProtocolError, RowRangeError

__all__ = ["FieldRef", "WIRE_TAG", "dtype_name", "check_dtype", "is_plain_dtype"]

# First element of a ref's wire form: lets a reader tell a ref from any other list.
WIRE_TAG = "fref1"

_NAMES: dict[np.dtype, str] = {}


def dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, cached: numpy computes it in Python on every access (several microseconds)."""
    try:
        return _NAMES[dtype]
    except KeyError:
        name = _NAMES[dtype] = dtype.name
        return name


@dataclass(frozen=True, slots=True)
class FieldRef:
    """Reference to rows ``[row_start, row_stop)`` of a blob stored in a StorageUnit.

    ``shape`` is the full stored shape (first axis = rows); ``dtype`` is the stored dtype name,
    which may be narrower than the field's native dtype (R3 as ``uint8``).
    """

    key: str
    unit_id: str
    field: str
    dtype: str
    shape: tuple[int, ...]
    row_start: int = 0
    row_stop: int | None = None
    batch: str | None = None
    _itemsize: int = field(default=0, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        shape = tuple(int(d) for d in self.shape)
        if not shape or any(d < 0 for d in shape):
            raise RowRangeError(f"FieldRef {self.key!r}: shape must have at least one axis >= 0, got {shape}")
        stop = shape[0] if self.row_stop is None else int(self.row_stop)
        start = int(self.row_start)
        if not 0 <= start <= stop <= shape[0]:
            raise RowRangeError(
                f"FieldRef {self.key!r}: rows [{start}, {stop}) outside the stored rows [0, {shape[0]})"
            )
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "row_start", start)
        object.__setattr__(self, "row_stop", stop)
        object.__setattr__(self, "_itemsize", _itemsize(self.dtype))

    @classmethod
    def of_stored(cls, key: str, unit_id: str, field: str, dtype: str, shape: tuple[int, ...],
                  batch: str | None) -> "FieldRef":
        """The ref to a whole blob just stored, from metadata that is valid by construction (the name of a
        plain dtype and the shape of an array with at least one axis): the checks of ``__init__`` skipped."""
        ref = _new(cls)
        _set(ref, "key", key)
        _set(ref, "unit_id", unit_id)
        _set(ref, "field", field)
        _set(ref, "dtype", dtype)
        _set(ref, "shape", shape)
        _set(ref, "row_start", 0)
        _set(ref, "row_stop", shape[0])
        _set(ref, "batch", batch)
        _set(ref, "_itemsize", _itemsize(dtype))
        return ref

    # -- derived -------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return int(self.row_stop) - self.row_start  # type: ignore[arg-type]

    def check_read(self, arr: np.ndarray, unit_id: str) -> None:
        """IntegrityError unless ``arr`` (what ``unit_id`` answered) has this ref's dtype and rows."""
        if dtype_name(arr.dtype) != self.dtype or arr.shape[1:] != self.shape[1:] or len(arr) != self.num_rows:
            raise IntegrityError(
                f"key {self.key!r} in unit {unit_id}: got {arr.dtype}{list(arr.shape)}, "
                f"the ref says {self.dtype}{[self.num_rows, *self.shape[1:]]}"
            )

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def row_nbytes(self) -> int:
        return self._itemsize * math.prod(self.shape[1:])

    @property
    def nbytes(self) -> int:
        """Bytes of the rows this ref covers (what a read moves), not of the whole blob."""
        return self.num_rows * self.row_nbytes

    @property
    def stored_nbytes(self) -> int:
        return self.shape[0] * self.row_nbytes

    @property
    def is_whole(self) -> bool:
        return self.row_start == 0 and self.row_stop == self.shape[0]

    def narrow(self, start: int, stop: int) -> "FieldRef":
        """Rows ``[start, stop)`` relative to this ref; never reads data."""
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self.num_rows:
            raise RowRangeError(
                f"FieldRef {self.key!r}: narrow({start}, {stop}) outside its {self.num_rows} rows"
            )
        return replace(self, row_start=self.row_start + start, row_stop=self.row_start + stop)

    def with_batch(self, batch: str | None) -> "FieldRef":
        return replace(self, batch=batch)

    # -- wire ----------------------------------------------------------------------------------
    def to_wire(self) -> list[Any]:
        """A msgpack-able list; ``FieldRef.from_wire`` inverts it."""
        return [WIRE_TAG, self.key, self.unit_id, self.field, self.dtype, list(self.shape),
                self.row_start, self.row_stop, self.batch]

    @classmethod
    def from_wire(cls, obj: Any) -> "FieldRef":
        """The ref of a wire form, or ProtocolError: names are strings, the dtype a plain numeric one, the
        shape at least one integer axis and rows integers (bools refused), all in int64 range, the batch a
        string or null. Rows outside the shape are RowRangeError, as in the constructor."""
        if not isinstance(obj, (list, tuple)) or len(obj) != 9 or obj[0] != WIRE_TAG:
            raise ProtocolError(f"not a FieldRef wire form: {obj!r:.200}")
        _, key, unit_id, fld, dtype, shape, start, stop, batch = obj
        if not all(isinstance(v, str) for v in (key, unit_id, fld, dtype)):
            raise ProtocolError(f"FieldRef wire form has non-string names: {obj!r:.200}")
        if dtype not in _PLAIN_NAMES:
            check_dtype(dtype)
            _PLAIN_NAMES.add(dtype)
        if not isinstance(shape, (list, tuple)) or not shape or not all(_wire_int(d) for d in shape):
            raise ProtocolError(f"FieldRef wire form has a bad shape (integers in [0, 2**63)): {shape!r:.200}")
        if not _wire_int(start) or not (stop is None or _wire_int(stop)):
            raise ProtocolError(f"FieldRef wire form has bad rows (integers in [0, 2**63)): "
                                f"[{start!r:.40}, {stop!r:.40})")
        if batch is not None and not isinstance(batch, str):
            raise ProtocolError(f"FieldRef wire form has a bad batch (a string or null): {batch!r:.100}")
        return cls(key=key, unit_id=unit_id, field=fld, dtype=dtype, shape=tuple(shape),
                   row_start=start, row_stop=stop, batch=batch)

    def __reduce__(self):  # slotted + frozen: pickle through the constructor
        return (_rebuild, (self.key, self.unit_id, self.field, self.dtype, self.shape,
                           self.row_start, self.row_stop, self.batch))


_ITEMSIZE: dict[str, int] = {}
_PLAIN_NAMES: set[str] = set()  # dtype names check_dtype accepted (a bounded set: numpy's plain dtypes)
_INT64_MAX = (1 << 63) - 1
# numpy kinds that are plain bytes: bool, signed, unsigned, float, complex.
_PLAIN_KINDS = frozenset("biufc")


def _wire_int(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _INT64_MAX


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
_new = object.__new__
_set = object.__setattr__


def _itemsize(dtype: str) -> int:
    try:
        return _ITEMSIZE[dtype]
    except KeyError:
        pass
    try:
        size = np.dtype(dtype).itemsize
    except TypeError as exc:
        raise ProtocolError(f"FieldRef dtype {dtype!r} is not a numpy dtype") from exc
    _ITEMSIZE[dtype] = size
    return size


def _rebuild(key, unit_id, fld, dtype, shape, start, stop, batch) -> FieldRef:
    return FieldRef(key=key, unit_id=unit_id, field=fld, dtype=dtype, shape=shape,
                    row_start=start, row_stop=stop, batch=batch)
