"""``codes_of``: the distinct version codes of a response, as ``np.unique`` gives them."""

import numpy as np
from hypothesis import given, settings, strategies as st

from dressage.proxy.recording.weights import codes_of


@settings(deadline=None)
@given(st.lists(st.integers(0, 4), max_size=12))
def test_codes_of_is_np_unique(codes):
    tv = np.asarray(codes, dtype=np.int32)
    assert codes_of(tv) == np.unique(tv).tolist()
    assert all(type(c) is int for c in codes_of(tv))


def test_one_version_and_mixed_versions():
    assert codes_of(np.full(7, 3, dtype=np.int32)) == [3]
    assert codes_of(np.array([2, 0, 2, 1], dtype=np.int32)) == [0, 1, 2]
    assert codes_of(np.zeros(0, dtype=np.int32)) == []
