"""The vectorized strict base64 decoder answers exactly what binascii's strict mode answers."""

import base64
import binascii
import random

import numpy as np
import pytest

from dressage.errors import WireFormatError
from dressage.fields import b64, decode_routed_experts_b64
from dressage.fields.b64 import FAST_MIN_CHARS, b64decode_strict


@pytest.fixture(autouse=True, params=["simd", "arrays"])
def path(request, monkeypatch):
    """Every test runs on both fast paths: pybase64's and the array operations'."""
    if request.param == "simd":
        if b64._simd is None:
            pytest.skip("pybase64's C extension is not active here")
    else:
        monkeypatch.setattr(b64, "_simd", None)
    return request.param


def _outcome(fn, data):
    try:
        return "ok", bytes(fn(data))
    except Exception as exc:  # noqa: BLE001 - the exception itself is what is compared
        return type(exc), str(exc)


def _strict(data):
    return binascii.a2b_base64(data, strict_mode=True)


@pytest.mark.parametrize("nbytes", [0, 1, 2, 3, FAST_MIN_CHARS * 3 // 4, FAST_MIN_CHARS * 3 // 4 + 1,
                                    FAST_MIN_CHARS * 3 // 4 + 2, 107_520, 107_521, 107_522])
def test_valid_input_decodes_to_the_same_bytes(nbytes):
    payload = random.Random(nbytes).randbytes(nbytes)
    text = base64.b64encode(payload).decode()
    for data in (text, text.encode()):
        out = b64decode_strict(data)
        assert bytes(out) == payload
    if len(text) >= FAST_MIN_CHARS:
        assert isinstance(b64decode_strict(text), np.ndarray)  # the vectorized path was taken
        assert not b64decode_strict(text).flags.writeable


def test_every_byte_value_in_every_position():
    payload = bytes(range(256)) * 64 + bytes(range(255, -1, -1)) * 64
    text = base64.b64encode(payload).decode()
    assert len(text) >= FAST_MIN_CHARS
    assert bytes(b64decode_strict(text)) == payload


@pytest.mark.parametrize("bad", ["=", " ", "\n", "-", "_", "\x00", "\u00e9", "==", "*", "\x7f"])
@pytest.mark.parametrize("where", [0, 1, 2, 3, 5000, -8, -5, -4, -3, -2, -1])
@pytest.mark.parametrize("how", ["replace", "insert", "delete"])
def test_bad_input_raises_what_binascii_raises(bad, where, how):
    text = list(base64.b64encode(random.Random(7).randbytes(12_001)).decode())  # ends in "="
    assert len(text) >= FAST_MIN_CHARS
    pos = where % len(text)
    if how == "replace":
        text[pos] = bad
    elif how == "insert":
        text.insert(pos, bad)
    else:
        del text[pos]
    data = "".join(text)
    expected = _outcome(_strict, data)
    assert _outcome(b64decode_strict, data) == expected
    if data.isascii():
        assert _outcome(b64decode_strict, data.encode()) == expected


def test_random_corruptions_match_binascii():
    rng = random.Random(3)
    for _ in range(300):
        text = list(base64.b64encode(rng.randbytes(rng.randint(9_000, 20_000))).decode())
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(text))
            text[pos] = rng.choice("=+/ \n\t-_.A")
        data = "".join(text)
        assert _outcome(b64decode_strict, data) == _outcome(_strict, data)


def test_routed_experts_decode_keeps_its_typed_errors_on_large_input():
    ids = np.random.default_rng(0).integers(0, 256, size=(30, 40, 8), dtype=np.int32)
    text = base64.b64encode(ids.tobytes()).decode()
    assert len(text) >= FAST_MIN_CHARS
    np.testing.assert_array_equal(decode_routed_experts_b64(text, 40, 8), ids)
    got = decode_routed_experts_b64(text, 40, 8, storage_dtype="uint8", num_experts=256)
    assert got.dtype == np.uint8 and np.array_equal(got, ids)
    broken = text[:100] + "!" + text[101:]
    with pytest.raises(WireFormatError, match="not valid base64"):
        decode_routed_experts_b64(broken, 40, 8)


def test_large_input_takes_the_path_under_test(path, monkeypatch):
    text = base64.b64encode(random.Random(5).randbytes(20_000)).decode()
    seen = []
    if path == "simd":
        real = b64._simd.b64decode
        monkeypatch.setattr(b64._simd, "b64decode", lambda *a, **k: seen.append(1) or real(*a, **k))
    else:
        monkeypatch.setattr(b64, "_PAIRS", _Spy(b64._PAIRS, seen))
    assert bytes(b64decode_strict(text)) == base64.b64decode(text) and seen == [1]


class _Spy:
    def __init__(self, table, seen):
        self._table, self._seen = table, seen

    def take(self, idx):
        self._seen.append(1)
        return self._table.take(idx)
