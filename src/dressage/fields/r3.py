"""R3 routed-expert codec: compact storage dtypes, range-checked, always restored to int32.

Expert ids are non-negative, so ``uint8`` (<= 256 experts) or ``uint16`` (<= 65,536) hold them
losslessly. Every id is checked before any conversion: a silent wrap-around would corrupt
Rollout Routing Replay without a trace.
"""

from __future__ import annotations

import numpy as np

from dressage.errors import ConfigError, ExpertIdRangeError, FieldShapeError

__all__ = [
    "R3_DTYPES",
    "DEFAULT_R3_DTYPE",
    "r3_dtype",
    "r3_itemsize",
    "max_expert_id",
    "check_row_bytes",
    "check_dtype_holds_experts",
    "encode_routed_experts",
    "decode_routed_experts",
]

R3_DTYPES: dict[str, np.dtype] = {
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "int32": np.dtype(np.int32),
}
DEFAULT_R3_DTYPE = "int32"


def r3_dtype(name: str) -> np.dtype:
    """The numpy dtype for a ``--routed-experts-dtype`` value."""
    try:
        return R3_DTYPES[str(name)]
    except KeyError:
        raise ConfigError(
            f"routed_experts_dtype: {name!r} is not one of {', '.join(R3_DTYPES)}"
        ) from None


def r3_itemsize(name: str) -> int:
    return r3_dtype(name).itemsize


def check_row_bytes(nbytes: int, num_layers: int, topk: int, itemsize: int) -> None:
    """:class:`FieldShapeError` unless ``nbytes`` of wire routing are whole ``[num_layers, topk]`` rows."""
    per_row = num_layers * topk * itemsize
    if nbytes % per_row:
        raise FieldShapeError(
            f"routed_experts has {nbytes} bytes, not a multiple of one row "
            f"({num_layers} layers x {topk} top-k x {itemsize} bytes = {per_row})"
        )


def max_expert_id(name: str) -> int:
    """Largest expert id the storage dtype can hold."""
    return int(np.iinfo(r3_dtype(name)).max)


def check_dtype_holds_experts(num_experts: int, name: str) -> None:
    """Raise :class:`ConfigError` when ``num_experts`` ids (0..num_experts-1) do not fit ``name``."""
    if int(num_experts) <= 0:
        raise ConfigError(f"num_experts must be positive, got {num_experts}")
    limit = max_expert_id(name)
    if int(num_experts) - 1 > limit:
        raise ConfigError(
            f"routed_experts_dtype {name} holds expert ids 0..{limit}, but the model has "
            f"{num_experts} experts; use "
            + ("uint16 or int32" if name == "uint8" else "int32")
        )


def _first_bad(ids: np.ndarray, low: int, high: int) -> tuple[int, ...] | None:
    bad = (ids < low) | (ids > high)
    if not bad.any():
        return None
    return tuple(int(i) for i in np.argwhere(bad)[0])


def encode_routed_experts(ids: np.ndarray, dtype: str = DEFAULT_R3_DTYPE,
                          num_experts: int | None = None) -> np.ndarray:
    """Return ``ids`` ([rows, layers, topk], any integer dtype) in the storage dtype.

    Raises :class:`ExpertIdRangeError` naming the first offending value, row, layer and slot
    if any id is negative, exceeds the dtype's range, or is ``>= num_experts`` when given.
    The input is never modified; an already-matching array is returned without a copy.
    """
    target = r3_dtype(dtype)
    ids = np.asarray(ids)
    if ids.ndim != 3:
        raise FieldShapeError(f"routed_experts must be [rows, num_layers, topk], got shape {ids.shape}")
    if ids.dtype.kind not in "iu":
        raise FieldShapeError(f"routed_experts must hold integers, got dtype {ids.dtype}")
    high = int(np.iinfo(target).max)
    if num_experts is not None:
        high = min(high, int(num_experts) - 1)
    if ids.size:
        # Cheap bounds test first, one pass over the ids; locate the culprit only when something is out
        # of range. A signed array is read as unsigned when every negative id then reads above ``high``.
        if ids.dtype.kind == "u":
            lo, hi = 0, int(ids.max())
        elif high <= int(np.iinfo(ids.dtype).max):
            lo, hi = 0, int(ids.view(ids.dtype.str.replace("i", "u")).max())
        else:
            lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi > high:
            row, layer, slot = _first_bad(ids, 0, high)
            raise ExpertIdRangeError(ids[row, layer, slot], row, layer, slot, str(target), high,
                                     num_experts=num_experts)
    if ids.dtype == target:
        return ids
    return ids.astype(target)


def decode_routed_experts(stored: np.ndarray) -> np.ndarray:
    """Restore stored expert ids to the int32 representation training consumes."""
    stored = np.asarray(stored)
    if stored.dtype.name not in R3_DTYPES:
        raise FieldShapeError(f"routed_experts stored as unsupported dtype {stored.dtype}")
    if stored.dtype == np.int32:
        return stored
    return stored.astype(np.int32)
