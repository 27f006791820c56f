"""Deterministic MoE routing and prefix hashes, vectorised over a whole token sequence.

Row ``i`` (the routing of token ``i``) is a function of the seed and tokens ``0..i`` only, so rows
re-sent for a cached prefix equal the rows first returned, as SGLang's prefix cache behaves. The
prefix hash is a polynomial hash mod 2**64 computed with one cumulative sum: no Python loop per token.
"""

from __future__ import annotations

import numpy as np

from dressage.fields.models import ModelSpec

__all__ = ["RoutingModel", "splitmix64"]

_P = 0x100000001B3 | 1          # odd, hence invertible mod 2**64
_P_INV = pow(_P, -1, 1 << 64)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """A bijective 64-bit mixer applied element-wise (uint64 in, uint64 out)."""
    z = x.astype(np.uint64, copy=True)
    z += _GOLDEN
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


class RoutingModel:
    """Prefix hashes and top-k expert ids for one model shape and seed."""

    def __init__(self, model: ModelSpec, seed: int = 0) -> None:
        self.model = model
        self.seed = int(seed)
        self._pow = np.ones(1, dtype=np.uint64)
        self._pow_inv = np.ones(1, dtype=np.uint64)
        # One salt per layer so that layers route differently for the same prefix.
        salts = np.arange(1, model.num_layers + 1, dtype=np.uint64) * np.uint64(0xD6E8FEB86659FD93)
        self._layer_salt = splitmix64(salts ^ np.uint64(self.seed))
        e = model.num_experts
        # Strides coprime with the expert count visit distinct experts for the first e steps.
        self._strides = np.array([d for d in range(1, e) if np.gcd(d, e) == 1] or [1], dtype=np.int32)
        self._topk_steps = np.arange(model.topk, dtype=np.int32)
        self._seed_term = splitmix64(np.array([self.seed], dtype=np.uint64))
        # Every (first expert, stride) pair's top-k ids, when that table is small enough to cache.
        self._table: np.ndarray | None = None
        if e * len(self._strides) * model.topk <= 1 << 22:
            firsts = np.repeat(np.arange(e, dtype=np.int32), len(self._strides))
            strides = np.tile(self._strides, e)
            self._table = (firsts[:, None] + strides[:, None] * self._topk_steps) % np.int32(e)

    def _powers(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self._pow) < n:
            size = max(n, 2 * len(self._pow))
            with np.errstate(over="ignore"):
                self._pow = np.concatenate(([1], np.cumprod(np.full(size - 1, _P, dtype=np.uint64)))).astype(np.uint64)
                self._pow_inv = np.concatenate(
                    ([1], np.cumprod(np.full(size - 1, _P_INV, dtype=np.uint64)))).astype(np.uint64)
        return self._pow[:n], self._pow_inv[:n]

    def prefix_hashes(self, tokens: np.ndarray) -> np.ndarray:
        """``h[i]`` = hash of (seed, tokens[0..i]); uint64 ``[len(tokens)]``."""
        t = np.asarray(tokens, dtype=np.int64)
        n = len(t)
        if n == 0:
            return np.empty(0, dtype=np.uint64)
        pw, pw_inv = self._powers(n)
        vals = t.astype(np.uint64) + np.uint64(1)
        with np.errstate(over="ignore"):
            vals[:1] += self._seed_term  # the seed acts as a token before the first
            # h_i = sum_j v_j P^(i-j) = P^i * sum_j v_j P^-j  (mod 2**64)
            return np.cumsum(vals * pw_inv, dtype=np.uint64) * pw

    def routed_experts(self, hashes: np.ndarray, start: int, stop: int) -> np.ndarray:
        """int32 ``[stop - start, num_layers, topk]``: rows ``start..stop-1`` from their prefix hashes."""
        h = hashes[start:stop]
        e, n_s = self.model.num_experts, len(self._strides)
        keys = splitmix64(h[:, None] ^ self._layer_salt[None, :])              # [rows, L]
        # Lemire's multiply-shift maps 32 random bits onto [0, n) without a (slow) 64-bit modulus.
        first = ((keys & np.uint64(0xFFFFFFFF)) * np.uint64(e)) >> np.uint64(32)
        which = ((keys >> np.uint64(32)) * np.uint64(n_s)) >> np.uint64(32)
        if self._table is not None:
            # One gather of topk contiguous ids per (row, layer) beats three passes of arithmetic.
            return self._table[(first * np.uint64(n_s) + which).astype(np.intp)]
        ids = self._strides[which.astype(np.intp)][..., None] * self._topk_steps
        ids += first.astype(np.int32)[..., None]
        ids %= e
        return ids
