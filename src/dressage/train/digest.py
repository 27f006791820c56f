"""samples_digest: one SHA-256 over restored Samples, for proving two paths gave the same data."""

from __future__ import annotations

import hashlib
import struct
from typing import Iterable

import numpy as np

from dressage.trajectory import Sample

__all__ = ["samples_digest", "DIGEST_FIELDS"]

# Field -> canonical dtype. Session ids are random, so they are left out; order comes from the caller.
DIGEST_FIELDS = {
    "tokens": np.dtype("<i4"),
    "loss_mask": np.dtype("<i4"),
    "token_versions": np.dtype("<i4"),
    "rollout_log_probs": np.dtype("<f4"),
    "rollout_routed_experts": np.dtype("<i4"),
}


def samples_digest(samples: Iterable[Sample]) -> str:
    """Hex SHA-256 over every Sample's fields in a fixed field order, dtype and byte order."""
    h = hashlib.sha256()
    for s in samples:
        if not s.is_restored:
            raise ValueError("samples_digest needs restored Samples (read their TQ fields first)")
        h.update(struct.pack("<qqd", s.response_length, -1 if s.group_index is None else s.group_index,
                             float("nan") if s.reward is None else s.reward))
        arrays = s.field_arrays()
        for name, dtype in DIGEST_FIELDS.items():
            a = arrays.get(name)
            h.update(name.encode())
            if a is None:
                h.update(b"\0none")
                continue
            a = np.ascontiguousarray(a, dtype=dtype)
            h.update(struct.pack(f"<{a.ndim + 1}q", a.ndim, *a.shape))
            h.update(a.tobytes())
    return h.hexdigest()
