"""Samples as plain JSON/msgpack values, so a trainer in another process can take them over HTTP.

Token fields travel as integer lists; resident large fields as ``{"dtype", "shape", "b64"}`` in JSON,
or, with ``binary`` (a msgpack answer), as ``{"dtype", "shape", "data"}`` with the exact bytes as a
msgpack bin (no base64: a third fewer bytes and no text codec on either side); fields still in the
TransferQueue as their pieces: ``{"ref": FieldRef wire form, "start", "stop"}`` or ``{"fill", "rows"}``.
Decoding takes either array form, validates every value and raises ``SampleWireError``.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any, Mapping

import numpy as np

from dressage.errors import DressageError, SampleWireError
from dressage.trajectory import SAMPLE_LARGE_FIELDS, Sample
from dressage.trajectory.pieces import Fill, Piece
from dressage.trajectory.sample import samples_of_session
from dressage.fields.refs import FieldRef

__all__ = ["SAMPLE_WIRE_VERSION", "MSGPACK_MEDIA_TYPE", "sample_to_wire", "sample_from_wire", "samples_wire",
           "remote_to_wire", "remote_from_wire"]

SAMPLE_WIRE_VERSION = 1
# The media type of the binary form: a reader that accepts it gets arrays as bytes, not base64.
MSGPACK_MEDIA_TYPE = "application/msgpack"
_ARRAY_DTYPES = {"float32", "int32", "int16", "uint16", "uint8", "int8"}


def _array_to_wire(a: np.ndarray, binary: bool) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    head = {"dtype": a.dtype.name, "shape": list(a.shape)}
    if binary:  # packed by msgpack as a bin straight from the array's memory
        return {**head, "data": memoryview(a.reshape(-1).view(np.uint8))}
    return {**head, "b64": base64.b64encode(a.tobytes()).decode("ascii")}


def _array_from_wire(obj: Any, what: str) -> np.ndarray:
    if not isinstance(obj, Mapping) or set(obj) not in ({"dtype", "shape", "b64"}, {"dtype", "shape", "data"}):
        raise SampleWireError(f"{what}: expected {{dtype, shape, b64|data}}, got keys "
                              f"{sorted(obj) if isinstance(obj, Mapping) else type(obj).__name__}")
    dtype, shape = obj["dtype"], obj["shape"]
    if dtype not in _ARRAY_DTYPES:
        raise SampleWireError(f"{what}: dtype {dtype!r:.40} is not one of {sorted(_ARRAY_DTYPES)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise SampleWireError(f"{what}: bad shape {shape!r:.80}")
    if "data" in obj:
        raw = obj["data"]
        if not isinstance(raw, bytes):
            raise SampleWireError(f"{what}: data must be bytes (a msgpack bin), got {type(raw).__name__}")
    else:
        try:
            raw = base64.b64decode(obj["b64"], validate=True)
        except (binascii.Error, TypeError, ValueError) as exc:
            raise SampleWireError(f"{what}: payload is not base64 ({exc})") from None
    want = np.dtype(dtype).itemsize * math.prod(shape)
    if len(raw) != want:
        raise SampleWireError(f"{what}: {len(raw)} bytes for {dtype}{shape} (want {want})")
    array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    # The bytes of a msgpack bin are this array's alone: a read-only view of them, as ray.get gives an
    # array, saves a copy into fresh pages (a tenth of a second per 50 MiB here).
    return array if "data" in obj else array.copy()


def _int_list(obj: Any, what: str, dtype: Any) -> np.ndarray:
    if not isinstance(obj, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in obj):
        raise SampleWireError(f"{what}: expected a list of integers")
    info = np.iinfo(dtype)
    if obj and (min(obj) < info.min or max(obj) > info.max):
        raise SampleWireError(f"{what}: a value is outside {np.dtype(dtype).name}")
    return np.asarray(obj, dtype=dtype)


def _piece_to_wire(p: Piece | Fill, binary: bool) -> dict[str, Any]:
    if isinstance(p, Fill):
        return {"fill": p.fill, "rows": p.rows}
    if isinstance(p.value, np.ndarray):
        return {"array": _array_to_wire(p.value[p.start:p.stop], binary), "start": 0, "stop": p.rows}
    return {"ref": p.value.to_wire(), "start": p.start, "stop": p.stop}


def _piece_from_wire(obj: Any, what: str) -> Piece | Fill:
    if not isinstance(obj, Mapping):
        raise SampleWireError(f"{what}: expected an object")
    if set(obj) == {"fill", "rows"}:
        rows, fill = obj["rows"], obj["fill"]
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0 \
                or not isinstance(fill, (int, float)) or isinstance(fill, bool) or not math.isfinite(fill):
            raise SampleWireError(f"{what}: bad fill {obj!r:.80}")
        return Fill(rows, fill)
    if set(obj) not in ({"ref", "start", "stop"}, {"array", "start", "stop"}):
        raise SampleWireError(f"{what}: expected {{ref|array, start, stop}} or {{fill, rows}}, got keys {sorted(obj)}")
    start, stop = obj["start"], obj["stop"]
    try:
        value: Any = FieldRef.from_wire(obj["ref"]) if "ref" in obj else _array_from_wire(obj["array"], what)
    except DressageError as exc:
        raise SampleWireError(f"{what}: {exc}") from None
    rows = value.num_rows if isinstance(value, FieldRef) else value.shape[0]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop)) or not 0 <= start <= stop <= rows:
        raise SampleWireError(f"{what}: rows [{start!r:.20}, {stop!r:.20}) outside [0, {rows})")
    return Piece(value, start, stop)


def remote_to_wire(s: Sample) -> dict[str, Any]:
    """Only what ``s`` still holds behind references: ``{"r3_trailing", "remote"}`` as in
    :func:`sample_to_wire` (plain lists and dicts, so it can ride in another record's metadata)."""
    return {"r3_trailing": list(s.r3_trailing),
            "remote": {name: [_piece_to_wire(p, False) for p in pieces] for name, pieces in s.remote.items()}}


def remote_from_wire(obj: Any) -> tuple[dict[str, tuple[Piece | Fill, ...]], tuple[int, ...]]:
    """``(remote, r3_trailing)`` from :func:`remote_to_wire`'s form (or a whole sample's); raises
    ``SampleWireError`` for any malformed value."""
    if not isinstance(obj, Mapping):
        raise SampleWireError(f"expected an object with 'remote' and 'r3_trailing', got {type(obj).__name__}")
    remote = obj.get("remote") or {}
    if not isinstance(remote, Mapping):
        raise SampleWireError("remote must be an object")
    trailing = obj.get("r3_trailing") or []
    if not isinstance(trailing, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                                 for d in trailing):
        raise SampleWireError(f"r3_trailing must be a list of positive integers, got {trailing!r:.60}")
    out: dict[str, tuple[Piece | Fill, ...]] = {}
    for name, pieces in remote.items():
        if name not in SAMPLE_LARGE_FIELDS or not isinstance(pieces, list):
            raise SampleWireError(f"remote: unknown field {name!r:.40} or pieces not a list")
        out[name] = tuple(_piece_from_wire(p, f"remote.{name}[{i}]") for i, p in enumerate(pieces))
    return out, tuple(trailing)


def sample_to_wire(s: Sample, *, binary: bool = False) -> dict[str, Any]:
    """A JSON-able dict (msgpack-able with ``binary``: arrays as bytes); :func:`sample_from_wire`
    inverts it exactly (refs stay refs)."""
    out: dict[str, Any] = {
        "v": SAMPLE_WIRE_VERSION,
        "tokens": s.tokens.tolist(), "response_length": int(s.response_length),
        "loss_mask": s.loss_mask.tolist(), "token_versions": s.token_versions.tolist(),
        "reward": s.reward, "session_id": s.session_id, "segment_index": int(s.segment_index),
        "group_index": s.group_index, "index": s.index, "metadata": s.metadata,
        "r3_trailing": list(s.r3_trailing),
        "remote": {name: [_piece_to_wire(p, binary) for p in pieces] for name, pieces in s.remote.items()},
    }
    for name, attr in SAMPLE_LARGE_FIELDS.items():
        value = getattr(s, attr)
        if value is not None:
            out[attr] = _array_to_wire(value, binary)
    return out


def sample_from_wire(obj: Any) -> Sample:
    """A Sample from :func:`sample_to_wire`'s form; any malformed value raises ``SampleWireError``."""
    if not isinstance(obj, Mapping) or obj.get("v") != SAMPLE_WIRE_VERSION:
        raise SampleWireError(f"not a sample wire form (v={SAMPLE_WIRE_VERSION}): {str(obj)[:120]}")
    known = {"v", "tokens", "response_length", "loss_mask", "token_versions", "reward", "session_id",
             "segment_index", "group_index", "index", "metadata", "r3_trailing", "remote", *SAMPLE_LARGE_FIELDS.values()}
    extra = set(obj) - known
    if extra:
        raise SampleWireError(f"sample wire form: unknown keys {sorted(extra)}")
    tokens = _int_list(obj.get("tokens"), "tokens", np.int32)
    R = obj.get("response_length")
    if not isinstance(R, int) or isinstance(R, bool) or not 0 <= R <= tokens.shape[0]:
        raise SampleWireError(f"response_length {R!r:.20} outside [0, {tokens.shape[0]}]")
    loss_mask = _int_list(obj.get("loss_mask"), "loss_mask", np.int8)
    versions = _int_list(obj.get("token_versions"), "token_versions", np.int32)
    if loss_mask.shape != (R,) or versions.shape != (R,):
        raise SampleWireError(f"loss_mask/token_versions must have response_length {R} entries")
    reward = obj.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))
                               or not math.isfinite(reward)):
        raise SampleWireError(f"reward must be a finite number or null, got {reward!r:.40}")
    for key in ("segment_index", "group_index", "index"):
        v = obj.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise SampleWireError(f"{key} must be an integer, got {v!r:.40}")
    meta = obj.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise SampleWireError("metadata and remote must be objects")
    remote, trailing = remote_from_wire(obj)
    sample = Sample(tokens=tokens, response_length=R, loss_mask=loss_mask, token_versions=versions,
                    reward=None if reward is None else float(reward), session_id=str(obj.get("session_id", "")),
                    segment_index=int(obj.get("segment_index") or 0), group_index=obj.get("group_index"),
                    index=obj.get("index"), metadata=dict(meta), r3_trailing=trailing)
    sample.remote.update(remote)
    for name, attr in SAMPLE_LARGE_FIELDS.items():
        if attr in obj:
            setattr(sample, attr, _array_from_wire(obj[attr], attr))
    return sample


def samples_wire(done: Any, *, binary: bool = False) -> list[dict[str, Any]]:
    """A finalized session's Segments as trainer-ready Samples in wire form (the RolloutManager's
    conversion: reward, group and the session's metadata on each)."""
    return [sample_to_wire(s, binary=binary)
            for s in samples_of_session(done.segments, reward=done.reward, metadata=done.metadata)]
