"""The one interface Segment building uses for field data: "rows [start, stop) of a step's field".

A field value is either a resident numpy array or a reference to rows stored elsewhere (a
TransferQueue ``FieldRef``). This module only needs a value's row count and trailing shape, so
Segment construction composes pieces identically whether or not TQ is on, and never reads data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, Union, runtime_checkable

import numpy as np

from dressage.errors import FieldShapeError

__all__ = [
    "RowSource",
    "FieldValue",
    "Piece",
    "Fill",
    "num_rows",
    "is_resident",
    "pieces_rows",
    "pieces_resident",
    "resolve_resident",
    "concat_pieces",
]


@runtime_checkable
class RowSource(Protocol):
    """Anything that stands for rows of a stored array without holding them (e.g. ``FieldRef``)."""

    @property
    def num_rows(self) -> int: ...

    @property
    def shape(self) -> tuple[int, ...]: ...


FieldValue = Union[np.ndarray, RowSource]


def num_rows(value: Any) -> int:
    """Rows of a field value: ``len`` of an array, ``num_rows`` of a reference."""
    if isinstance(value, np.ndarray):
        return int(value.shape[0])
    rows = getattr(value, "num_rows", None)
    if rows is None:
        raise FieldShapeError(f"{type(value).__name__} is neither an array nor a row reference")
    return int(rows)


def trailing_shape(value: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in value.shape[1:])


def is_resident(value: Any) -> bool:
    return isinstance(value, np.ndarray)


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows ``[start, stop)`` of one step's field value (array or reference)."""

    value: Any
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class Fill:
    """``rows`` entries of a constant: environment tokens (logprob 0.0, mask 0, version -1)."""

    rows: int
    fill: float | int = 0


def pieces_rows(pieces: Iterable[Piece | Fill]) -> int:
    return sum(p.rows for p in pieces)


def pieces_resident(pieces: Iterable[Piece | Fill]) -> bool:
    return all(isinstance(p, Fill) or is_resident(p.value) for p in pieces)


def resolve_resident(piece: Piece) -> np.ndarray:
    """Default resolver: slice a resident array. References need a TQ reader."""
    if not is_resident(piece.value):
        raise FieldShapeError(
            f"piece refers to {type(piece.value).__name__}; read it through the TransferQueue reader"
        )
    return piece.value[piece.start:piece.stop]


def concat_pieces(pieces: Iterable[Piece | Fill], dtype: np.dtype | str,
                  trailing: tuple[int, ...] = (),
                  resolve: Callable[[Piece], np.ndarray] = resolve_resident) -> np.ndarray:
    """Materialise pieces into one new array of ``dtype`` (one copy, preallocated)."""
    pieces = list(pieces)
    out = np.empty((pieces_rows(pieces), *trailing), dtype=dtype)
    pos = 0
    for p in pieces:
        if isinstance(p, Fill):
            out[pos:pos + p.rows] = p.fill
        else:
            block = resolve(p)
            if block.shape[0] != p.rows or tuple(block.shape[1:]) != tuple(trailing):
                raise FieldShapeError(
                    f"resolved piece has shape {tuple(block.shape)}, expected ({p.rows}, *{trailing})"
                )
            out[pos:pos + p.rows] = block
        pos += p.rows
    return out
