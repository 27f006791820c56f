"""samples_digest: one SHA-256 over restored Samples, for proving two paths gave the same data.

Each Sample hashes on its own (so DP ranks can hash their shards); the batch digest hashes the
per-Sample digests in ``Sample.order_key`` order, so sharding and arrival order do not matter.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Iterable

import numpy as np

from dressage.trajectory import Sample

__all__ = ["samples_digest", "sample_digest", "combine_digests", "DIGEST_FIELDS"]

# Field -> canonical dtype. Session ids are random, so they are left out.
DIGEST_FIELDS = {
    "tokens": np.dtype("<i4"),
    "loss_mask": np.dtype("<i4"),
    "token_versions": np.dtype("<i4"),
    "rollout_log_probs": np.dtype("<f4"),
    "rollout_routed_experts": np.dtype("<i4"),
}


def sample_digest(s: Sample) -> bytes:
    """SHA-256 of one restored Sample's fields in a fixed field order, dtype and byte order."""
    if not s.is_restored:
        raise ValueError("samples_digest needs restored Samples (read their TQ fields first)")
    h = hashlib.sha256()
    h.update(struct.pack("<qd", s.response_length, float("nan") if s.reward is None else s.reward))
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
    return h.digest()


def combine_digests(keyed: Iterable[tuple[tuple, bytes]]) -> str:
    """Hex digest over (order key, sample digest) pairs, sorted by key."""
    h = hashlib.sha256()
    for _, d in sorted(keyed, key=lambda kd: kd[0]):
        h.update(d)
    return h.hexdigest()


def samples_digest(samples: Iterable[Sample]) -> str:
    return combine_digests((s.order_key, sample_digest(s)) for s in samples)
