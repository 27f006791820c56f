"""The whole-array path of ``output_token_logprobs`` answers exactly what the per-entry checks answer."""

import random
import warnings

import numpy as np
import pytest

from dressage.errors import FieldShapeError, WireFormatError
from dressage.fields import decode_generate_response, sglang
from dressage.fields.sglang import decode_output_token_logprobs

_LOGPROBS = [0.0, -1.5, float("nan"), float("inf"), -float("inf"), 1e300, -1e-50, 0, 1, True, None, "x", -0.0]
_IDS = [0, 1, 2**31 - 1, 2**31, -1, 2**70, True, False, 1.0, None, "3", np.int64(5)]


def _outcome(entries):
    try:
        ids, lps = decode_output_token_logprobs(entries)
    except Exception as exc:  # noqa: BLE001 - the exception itself is what is compared
        return type(exc), str(exc)
    return ids.dtype, ids.tolist(), lps.dtype, [repr(v) for v in lps.tolist()]


def _entries(rng):
    out = []
    for _ in range(rng.randint(0, 5)):
        k = rng.random()
        if k < 0.7:
            lp = rng.choice(_LOGPROBS) if rng.random() < 0.3 else -rng.random() * 5
            tid = rng.choice(_IDS) if rng.random() < 0.3 else rng.randint(0, 1000)
            out.append([lp, tid, None])
        elif k < 0.8:
            out.append((rng.random(), rng.randint(0, 9)))
        elif k < 0.9:
            out.append([rng.random()])
        else:
            out.append(rng.choice(["ab", {"0": 1}, 5, None, [1.0, 2, "t", 4]]))
    return out


def test_every_input_gets_the_per_entry_answer(monkeypatch):
    rng = random.Random(0)
    cases = [_entries(rng) for _ in range(3000)]
    warnings.simplefilter("ignore", RuntimeWarning)  # 1e300 into float32, on both paths
    fast = [_outcome(c) for c in cases]
    monkeypatch.setattr(sglang, "_plain_logprobs", lambda entries: None)
    slow = [_outcome(c) for c in cases]
    assert fast == slow
    assert sum(1 for f in fast if f[0] == np.int32) > 500  # both answers and errors were compared
    assert sum(1 for f in fast if f[0] is WireFormatError) > 500


def test_plain_entries_take_the_array_path():
    entries = [[-0.5, 7, "a"], [-1.25, 2**31 - 1, None]]
    ids, lps = sglang._plain_logprobs(entries)
    assert ids.dtype == np.int32 and ids.tolist() == [7, 2**31 - 1]
    assert lps.dtype == np.float32 and lps.tolist() == [-0.5, -1.25]
    assert sglang._plain_logprobs([[-0.5, 2**31, None]]) is None
    assert sglang._plain_logprobs([[float("nan"), 1, None]]) is None


@pytest.mark.parametrize("output_ids, err", [([5, 6], None), ([5, 7], FieldShapeError), ([5], FieldShapeError),
                                             ([5, True], WireFormatError), ([5, -1], WireFormatError),
                                             ([5, 2**31], WireFormatError), (np.asarray([5, 6]), None),
                                             ([np.int64(5), 6], None), ([5.0, 6], WireFormatError)])
def test_output_ids_are_checked_against_the_logprob_ids(output_ids, err):
    body = {"output_ids": output_ids, "meta_info": {"output_token_logprobs": [[-0.1, 5, None], [-0.2, 6, None]]}}
    if err is None:
        out = decode_generate_response(body, prompt_len=3)
        assert out.output_ids.tolist() == [5, 6]
    else:
        with pytest.raises(err):
            decode_generate_response(body, prompt_len=3)


def test_session_prefix_and_id_checks_keep_their_answers():
    from dressage.trajectory.session import _as_ids, _is_prefix

    ids = np.asarray([3, 1, 4, 1, 5], np.int32)
    assert _is_prefix(ids, ids[:3].copy()) and _is_prefix(ids, ids) and _is_prefix(ids, ids[:0])
    assert not _is_prefix(ids, np.asarray([3, 1, 5], np.int32)) and not _is_prefix(ids[:2], ids)
    assert _is_prefix(ids, np.asarray([3, 1], np.int64))  # other dtypes compare by value
    assert not _is_prefix(ids, np.asarray([3, 2], np.int64))
    assert _as_ids(ids, "x") is ids
    for bad in (np.asarray([1, -1], np.int32), np.asarray([2**31], np.int64), [1, -2]):
        with pytest.raises(FieldShapeError, match="outside 0..2"):
            _as_ids(bad, "prompt_ids")
    with pytest.raises(FieldShapeError, match="integers"):
        _as_ids(np.asarray([1.0]), "prompt_ids")
    assert _as_ids([], "x").dtype == np.int32 and _as_ids(np.asarray([7], np.int64), "x").dtype == np.int32
