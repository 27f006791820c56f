"""The trajectory fields Dressage knows: dtype, per-token shape and which tokens they cover.

A field's ``scope`` says what its first axis counts: ``sequence`` (every token), ``response``
(response tokens only, as slime's ``loss_mask`` / ``rollout_log_probs``) or ``rows`` (R3: one row
per token that went through the model, i.e. ``T - 1`` rows for a sequence of ``T`` tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dressage.errors import FieldShapeError, UnknownFieldError

__all__ = ["FieldSpec", "FIELDS", "TRANSFERABLE_FIELDS", "get_field", "check_field_names"]

Scope = Literal["sequence", "response", "rows"]


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One trajectory field.

    ``per_token`` names the trailing axes (symbols resolved against a model: ``num_layers``,
    ``topk``); an empty tuple means one scalar per token.
    """

    name: str
    dtype: np.dtype
    scope: Scope
    per_token: tuple[str, ...] = ()
    transferable: bool = False
    doc: str = ""

    def trailing_shape(self, num_layers: int | None = None, topk: int | None = None) -> tuple[int, ...]:
        env = {"num_layers": num_layers, "topk": topk}
        dims = []
        for sym in self.per_token:
            value = env[sym]
            if value is None:
                raise FieldShapeError(f"field {self.name!r} needs {sym} to know its shape")
            dims.append(int(value))
        return tuple(dims)

    def check(self, array: np.ndarray, length: int, *, num_layers: int | None = None,
              topk: int | None = None, what: str = "") -> None:
        """Raise :class:`FieldShapeError` unless ``array`` is ``[length, *trailing]``."""
        expected = (int(length), *self.trailing_shape(num_layers, topk))
        if tuple(array.shape) != expected:
            where = f" ({what})" if what else ""
            raise FieldShapeError(
                f"field {self.name!r}{where}: expected shape {expected}, got {tuple(array.shape)}"
            )


FIELDS: dict[str, FieldSpec] = {
    spec.name: spec
    for spec in (
        FieldSpec("tokens", np.dtype(np.int32), "sequence", doc="prompt + response token ids"),
        FieldSpec("loss_mask", np.dtype(np.int8), "response",
                  doc="1 for model-generated tokens, 0 for environment / template tokens"),
        FieldSpec("token_versions", np.dtype(np.int32), "response",
                  doc="policy (weight) version that produced each response token; -1 for environment tokens"),
        FieldSpec("logprobs", np.dtype(np.float32), "response", transferable=True,
                  doc="rollout log-probabilities of response tokens; 0.0 on environment tokens"),
        FieldSpec("routed_experts", np.dtype(np.int32), "rows", ("num_layers", "topk"), transferable=True,
                  doc="R3: top-k expert ids per MoE layer for every token that went through the model"),
    )
}

TRANSFERABLE_FIELDS: tuple[str, ...] = tuple(n for n, s in FIELDS.items() if s.transferable)


def get_field(name: str) -> FieldSpec:
    try:
        return FIELDS[name]
    except KeyError:
        raise UnknownFieldError(name, tuple(FIELDS)) from None


def check_field_names(names, *, allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Validate a list of field names (e.g. ``--transfer-params``); return them de-duplicated, in order."""
    allowed = tuple(FIELDS) if allowed is None else allowed
    out: list[str] = []
    for name in names:
        if name not in allowed:
            raise UnknownFieldError(name, allowed)
        if name not in out:
            out.append(name)
    return tuple(out)
