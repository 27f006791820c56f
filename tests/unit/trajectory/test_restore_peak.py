"""A compact-dtype routing restores straight into its final int32 array: no stored-dtype copy between."""

import tracemalloc

import numpy as np
import pytest

from dressage.errors import FieldShapeError
from dressage.trajectory.pieces import Piece
from dressage.trajectory.segment import materialize_pieces


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int32"])
def test_routed_experts_restore_allocates_only_the_final_array(dtype):
    rng = np.random.default_rng(0)
    steps = [rng.integers(0, 200, (4096, 40, 8)).astype(dtype) for _ in range(3)]
    pieces = [Piece(a, 100, 4000) for a in steps]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = materialize_pieces("routed_experts", pieces, (40, 8))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert out.dtype == np.int32 and out.shape == (3 * 3900, 40, 8)
    np.testing.assert_array_equal(out, np.concatenate([a[100:4000] for a in steps]).astype(np.int32))
    assert peak <= 1.01 * out.nbytes, peak / out.nbytes


def test_an_unsupported_stored_dtype_is_refused():
    with pytest.raises(FieldShapeError, match="unsupported dtype"):
        materialize_pieces("routed_experts", [Piece(np.zeros((2, 1, 1), np.float32), 0, 2)], (1, 1))
