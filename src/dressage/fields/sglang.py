"""SGLang ``/generate`` wire format: decode (and, for the built-in engine, encode) ``meta_info``.

Facts of the format:
- ``meta_info["output_token_logprobs"]``: a list of ``[logprob, token_id, text | None]``.
- ``meta_info["routed_experts"]``: base64 of int32 bytes, rows ``[routed_experts_start_len, T-1)``
  of the request's full sequence (``T`` = input + output tokens), each row ``num_layers x topk``.
  An optional ``meta_info["routed_experts_dtype"]`` tag names another integer dtype.
- ``meta_info["weight_version"]``: the engine's policy version (a string) on every answer.
- A request aborted while still in the engine's queue answers with ``finish_reason.type ==
  "abort"``, its output so far (often none) and neither ``prompt_tokens`` nor ``routed_experts``.
  With R3 on such an answer is a cut that keeps nothing: its tokens have no routing to replay.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from dressage.errors import FieldShapeError, WireFormatError
from dressage.fields.r3 import encode_routed_experts
from dressage.fields.r3_stream import RoutedExpertsSpec, decode_routed_experts_string

__all__ = [
    "GenerateOutput",
    "RoutedExpertsSpec",
    "cut_keeps_nothing",
    "decode_output_token_logprobs",
    "decode_routed_experts_b64",
    "encode_routed_experts_b64",
    "decode_generate_response",
    "finish_type",
    "is_queued_abort",
    "weight_version_of",
]

@dataclass(frozen=True, slots=True)
class GenerateOutput:
    """One normalised ``/generate`` response: this call's output tokens and their large fields."""

    output_ids: np.ndarray          # int32 [R]
    logprobs: np.ndarray | None     # float32 [R]
    routed_experts: np.ndarray | None  # int32, or the storage dtype asked for: [rows, L, K], rows [start, P+R-1)
    finish_reason: str | None
    meta_info: Mapping[str, Any]
    weight_version: str | None = None
    """``meta_info.weight_version`` as the engine sent it (``None`` when it sent none)."""
    dropped_tokens: int = 0
    """Output tokens of an aborted answer that could not be kept (no routing came with them)."""

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def finish_type(meta: Mapping[str, Any]) -> str | None:
    """``finish_reason`` as a plain string (SGLang sends ``{"type": ...}`` or a string)."""
    finish = meta.get("finish_reason")
    if isinstance(finish, Mapping):
        finish = finish.get("type")
    return finish if isinstance(finish, str) else None


def is_queued_abort(meta: Mapping[str, Any]) -> bool:
    """An abort answered for a request still in the engine's queue (no ``prompt_tokens``)."""
    return finish_type(meta) == "abort" and "prompt_tokens" not in meta


def cut_keeps_nothing(meta: Mapping[str, Any], *, want_logprobs: bool, want_routed_experts: bool) -> bool:
    """An abort cut before the engine captured the routing or the scores this call asked for (still
    queued, or a re-queued retraction): none of its tokens can be trained on, so nothing of it is
    decoded or kept and the call resumes from where it stood."""
    return finish_type(meta) == "abort" and ((want_routed_experts and meta.get("routed_experts") is None)
                                             or (want_logprobs and "output_token_logprobs" not in meta))


def weight_version_of(meta: Mapping[str, Any]) -> str | None:
    """The engine's ``weight_version`` for this answer; ``None`` when absent or empty."""
    version = meta.get("weight_version")
    if isinstance(version, bool) or not isinstance(version, (str, int)):
        return None
    text = str(version)
    return text if text.strip() else None


def decode_output_token_logprobs(entries: Any) -> tuple[np.ndarray, np.ndarray]:
    """Split ``output_token_logprobs`` into (token ids int32, logprobs float32)."""
    if not isinstance(entries, list):
        raise WireFormatError(f"output_token_logprobs must be a list, got {type(entries).__name__}")
    plain = _plain_logprobs(entries)
    if plain is not None:
        return plain
    n = len(entries)
    ids = np.empty(n, dtype=np.int32)
    lps = np.empty(n, dtype=np.float32)
    for i, entry in enumerate(entries):
        if not isinstance(entry, (list, tuple)) or len(entry) < 2:
            raise WireFormatError(f"output_token_logprobs[{i}] must be [logprob, token_id, text], got {entry!r}")
        lp, tid = entry[0], entry[1]
        if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid < 2**31:
            raise WireFormatError(f"output_token_logprobs[{i}]: token id {tid!r} is not an integer in 0..2**31-1")
        if lp is None:
            # SGLang reports None for a token it did not score; training must not see NaN silently.
            raise WireFormatError(f"output_token_logprobs[{i}]: logprob is null")
        if isinstance(lp, bool) or not isinstance(lp, (int, float)):
            raise WireFormatError(f"output_token_logprobs[{i}]: logprob {lp!r} is not a number")
        if not math.isfinite(lp):
            # NaN / Infinity would be trained on (and make every later read invalid JSON).
            raise WireFormatError(f"output_token_logprobs[{i}]: logprob {lp!r} is not finite")
        if lp > 0 or lp < -_FLOAT32_MAX:
            # A probability above 1, or a value float32 stores as -inf: not a logprob to train on.
            raise WireFormatError(f"output_token_logprobs[{i}]: logprob {lp!r} is not in -3.4e38..0 "
                                  "(a log-probability float32 can hold)")
        ids[i] = tid
        lps[i] = lp
    return ids, lps


def _plain_logprobs(entries: list) -> tuple[np.ndarray, np.ndarray] | None:
    """The usual answer (every entry a list ``[float, int, ...]``, all finite and in range) with the
    checks done on whole arrays; ``None`` for anything else, which the per-entry loop words."""
    if not all(type(e) is list and len(e) >= 2 and type(e[0]) is float and type(e[1]) is int for e in entries):
        return None
    try:
        ids = np.array([e[1] for e in entries], dtype=np.int64)
    except OverflowError:
        return None
    lps = np.array([e[0] for e in entries], dtype=np.float64)
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= 2**31 or not np.isfinite(lps).all()
                     or float(lps.max()) > 0 or float(lps.min()) < -_FLOAT32_MAX):
        return None
    return ids.astype(np.int32), lps.astype(np.float32)


def decode_routed_experts_b64(data: str | bytes, num_layers: int, topk: int, dtype: str = "int32", *,
                              storage_dtype: str | None = None, num_experts: int | None = None) -> np.ndarray:
    """Decode base64 routed experts into a ``[rows, num_layers, topk]`` array.

    Without ``storage_dtype`` the result is an int32 copy. With it (``uint8`` / ``uint16`` / ``int32``)
    the ids are range-checked on the decoded wire bytes (``ExpertIdRangeError``, also for ids
    ``>= num_experts`` when given) and converted once, straight into the storage dtype; when the wire
    dtype already is the storage dtype the result is a read-only view of the decoded bytes.
    The decoder is :class:`~dressage.fields.r3_stream.RoutedExpertsStream`, fed the string at once.
    """
    spec = RoutedExpertsSpec(num_layers, topk, storage_dtype or "int32", num_experts if storage_dtype else None)
    return decode_routed_experts_string(data, spec, dtype, checked=storage_dtype is not None)


def encode_routed_experts_b64(ids: np.ndarray) -> str:
    """Encode ``[rows, L, K]`` ids the way SGLang sends them (int32 bytes, base64)."""
    return base64.b64encode(np.ascontiguousarray(ids, dtype=np.int32).tobytes()).decode("ascii")


def _check_ids(output_ids: Any) -> None:
    if type(output_ids) is list and all(type(t) is int for t in output_ids) and (
            not output_ids or (min(output_ids) >= 0 and max(output_ids) < 2**31)):
        return  # plain ints in range: the usual answer
    if not isinstance(output_ids, (list, np.ndarray)) or any(
            isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < 2**31 for t in output_ids):
        raise WireFormatError("output_ids must be a list of integers in 0..2**31-1")


def decode_generate_response(body: Any, *, prompt_len: int, routed_experts_start_len: int = 0,
                             num_layers: int | None = None, topk: int | None = None,
                             want_logprobs: bool = True, want_routed_experts: bool = False,
                             routed_experts_dtype: str | None = None,
                             num_experts: int | None = None) -> GenerateOutput:
    """Validate and normalise one ``/generate`` JSON response.

    Checks that the logprob entries match ``output_ids`` one to one and that the routed-expert
    rows cover exactly ``[routed_experts_start_len, prompt_len + len(output_ids) - 1)``.
    ``routed_experts_dtype`` (with ``num_experts``) decodes the routing straight into that storage
    dtype, range-checked (see :func:`decode_routed_experts_b64`); by default it is int32.
    """
    if not isinstance(body, Mapping):
        raise WireFormatError(f"/generate response must be a JSON object, got {type(body).__name__}")
    meta = body.get("meta_info")
    if not isinstance(meta, Mapping):
        raise WireFormatError("/generate response has no meta_info object")
    finish = finish_type(meta)
    version = weight_version_of(meta)
    if cut_keeps_nothing(meta, want_logprobs=want_logprobs, want_routed_experts=want_routed_experts):
        ids = body.get("output_ids")
        return GenerateOutput(np.empty(0, dtype=np.int32), np.empty(0, dtype=np.float32) if want_logprobs else None,
                              None, finish, meta, version,
                              dropped_tokens=len(ids) if isinstance(ids, list) else 0)
    output_ids = body.get("output_ids")
    if output_ids is not None:
        _check_ids(output_ids)
    logprobs = None
    if want_logprobs:
        if "output_token_logprobs" not in meta:
            raise WireFormatError("meta_info.output_token_logprobs missing (was return_logprob set?)")
        lp_ids, logprobs = decode_output_token_logprobs(meta["output_token_logprobs"])
        if output_ids is None:
            output_ids = lp_ids
        elif len(output_ids) != len(lp_ids) or not (output_ids == lp_ids.tolist() if isinstance(output_ids, list)
                                                    else np.array_equal(np.asarray(output_ids, dtype=np.int64), lp_ids)):
            raise FieldShapeError(
                f"output_ids ({len(output_ids)} tokens) and output_token_logprobs ({len(lp_ids)} entries) disagree"
            )
    if output_ids is None:
        raise WireFormatError("/generate response has neither output_ids nor output_token_logprobs")
    out = np.asarray(output_ids, dtype=np.int32)
    routed = None
    if want_routed_experts:
        if num_layers is None or topk is None:
            raise WireFormatError("decoding routed_experts needs num_layers and topk")
        if "routed_experts" not in meta:
            raise WireFormatError(
                "meta_info.routed_experts missing (start the engine with --enable-return-routed-experts "
                "and send return_routed_experts)"
            )
        routed = meta["routed_experts"]
        if isinstance(routed, np.ndarray):
            routed = _decoded_routing(routed, num_layers, topk, routed_experts_dtype, num_experts)
        else:
            routed = decode_routed_experts_b64(routed, num_layers, topk, str(meta.get("routed_experts_dtype", "int32")),
                                               storage_dtype=routed_experts_dtype, num_experts=num_experts)
        expected = prompt_len + len(out) - 1 - routed_experts_start_len
        if routed.shape[0] != expected:
            raise FieldShapeError(
                f"routed_experts has {routed.shape[0]} rows; expected {expected} = prompt {prompt_len} + "
                f"output {len(out)} - 1 - routed_experts_start_len {routed_experts_start_len}"
            )
    return GenerateOutput(out, logprobs, routed, finish, meta, version)


def _decoded_routing(ids: np.ndarray, num_layers: int, topk: int, storage_dtype: str | None,
                     num_experts: int | None) -> np.ndarray:
    """Routing the engine client already decoded (:mod:`dressage.proxy.engines.r3_body`): checked
    for shape and range like decoded text, without a copy when it already is in the storage dtype."""
    if ids.ndim != 3 or ids.shape[1:] != (num_layers, topk):
        raise FieldShapeError(f"routed_experts has shape {ids.shape}, not [rows, {num_layers}, {topk}]")
    if storage_dtype is None:
        return ids.astype(np.int32)
    return encode_routed_experts(ids, storage_dtype, num_experts=num_experts)
