"""Field registry, R3 codec and SGLang wire decoding."""

import base64

import numpy as np
import pytest

from dressage.errors import (ConfigError, ExpertIdRangeError, FieldShapeError, UnknownFieldError,
                             WireFormatError)
from dressage.fields import (FIELDS, check_dtype_holds_experts, check_field_names, decode_generate_response,
                             decode_routed_experts, decode_routed_experts_b64, encode_routed_experts,
                             encode_routed_experts_b64, get_field, get_model, r3_itemsize)


def test_registry_has_slime_token_fields_with_dtypes():
    assert FIELDS["logprobs"].dtype == np.float32
    assert FIELDS["routed_experts"].trailing_shape(40, 8) == (40, 8)
    assert FIELDS["routed_experts"].scope == "rows"
    assert {n for n, s in FIELDS.items() if s.transferable} == {"logprobs", "routed_experts"}
    with pytest.raises(UnknownFieldError, match="log_probs"):
        get_field("log_probs")
    with pytest.raises(UnknownFieldError):
        check_field_names(["logprobs", "expert_ids"], allowed=("logprobs", "routed_experts"))
    assert check_field_names(["logprobs", "logprobs"]) == ("logprobs",)


@pytest.mark.parametrize("dtype, itemsize", [("uint8", 1), ("uint16", 2), ("int32", 4)])
def test_r3_round_trip_restores_int32(dtype, itemsize):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 256, size=(17, 40, 8), dtype=np.int32)
    stored = encode_routed_experts(ids, dtype)
    assert stored.dtype.itemsize == itemsize
    assert stored.nbytes == ids.nbytes * itemsize // 4
    back = decode_routed_experts(stored)
    assert back.dtype == np.int32
    np.testing.assert_array_equal(back, ids)


def test_uint8_rejects_id_256_naming_value_layer_and_position():
    ids = np.zeros((5, 4, 2), dtype=np.int32)
    ids[3, 2, 1] = 256
    with pytest.raises(ExpertIdRangeError) as info:
        encode_routed_experts(ids, "uint8")
    err = info.value
    assert (err.value, err.row, err.layer, err.slot) == (256, 3, 2, 1)
    assert "256" in str(err) and "row 3" in str(err) and "layer 2" in str(err)
    assert ids[3, 2, 1] == 256  # input untouched


def test_uint16_rejects_negative_and_too_large():
    ids = np.zeros((2, 1, 1), dtype=np.int64)
    ids[1, 0, 0] = 70_000
    with pytest.raises(ExpertIdRangeError, match="70000"):
        encode_routed_experts(ids, "uint16")
    ids[1, 0, 0] = -1
    with pytest.raises(ExpertIdRangeError, match="-1"):
        encode_routed_experts(ids, "int32")


@pytest.mark.parametrize("src", ["int8", "int16", ">i4", "int32", "int64"])
@pytest.mark.parametrize("target, num_experts", [("uint8", None), ("uint8", 100), ("int32", None), ("int32", 64),
                                                 ("uint16", None)])
def test_a_negative_id_is_refused_from_every_signed_dtype_into_every_storage_dtype(src, target, num_experts):
    """The one-pass bounds test reads a signed array as unsigned only where every negative then reads
    above the limit (not int8 into uint8 with no expert count: -1 would read 255)."""
    ids = np.zeros((3, 2, 2), dtype=src)
    ids[1, 1, 0] = -1
    with pytest.raises(ExpertIdRangeError) as info:
        encode_routed_experts(ids, target, num_experts=num_experts)
    assert (info.value.value, info.value.row, info.value.layer, info.value.slot) == (-1, 1, 1, 0)
    ids[1, 1, 0] = np.iinfo(src).min
    with pytest.raises(ExpertIdRangeError):
        encode_routed_experts(ids, target, num_experts=num_experts)
    ids[1, 1, 0] = 7
    out = encode_routed_experts(ids[:, ::-1], target, num_experts=num_experts)  # strided: a view still works
    assert out.dtype == np.dtype(target) and int(out[1, 0, 0]) == 7 and int(out.sum()) == 7


def test_num_experts_bound_is_checked_too():
    ids = np.full((1, 1, 1), 20, dtype=np.int32)
    with pytest.raises(ExpertIdRangeError, match="0..15"):
        encode_routed_experts(ids, "int32", num_experts=16)


def test_only_an_id_the_model_has_but_the_dtype_cannot_hold_suggests_a_wider_dtype():
    ids = np.zeros((1, 1, 1), dtype=np.int32)
    ids[0, 0, 0] = 16  # past the model's 16 experts: no dtype makes it one of them
    with pytest.raises(ExpertIdRangeError, match="0..15") as info:
        encode_routed_experts(ids, "uint8", num_experts=16)
    assert "not an expert of the model, which has 16" in str(info.value)
    assert "wider" not in str(info.value) and info.value.num_experts == 16
    ids[0, 0, 0] = -3
    with pytest.raises(ExpertIdRangeError, match="is negative") as info:
        encode_routed_experts(ids, "uint8", num_experts=16)
    assert "wider" not in str(info.value)
    ids[0, 0, 0] = 300  # one of the model's 512 experts that uint8 cannot hold: a wider dtype helps
    with pytest.raises(ExpertIdRangeError, match="does not fit uint8.*choose a wider --routed-experts-dtype"):
        encode_routed_experts(ids, "uint8", num_experts=512)
    with pytest.raises(ExpertIdRangeError, match="choose a wider"):
        encode_routed_experts(ids, "uint8")  # no expert count: only the dtype bounds it


def test_dtype_must_hold_model_experts():
    check_dtype_holds_experts(256, "uint8")
    with pytest.raises(ConfigError, match="uint8"):
        check_dtype_holds_experts(get_model("qwen3-next-80b-a3b").num_experts, "uint8")
    check_dtype_holds_experts(65_536, "uint16")
    with pytest.raises(ConfigError):
        check_dtype_holds_experts(65_537, "uint16")
    with pytest.raises(ConfigError, match="int8"):
        r3_itemsize("int8")


def _hand_built_response(prompt_len, out_ids, start, L=2, K=2):
    rows = prompt_len + len(out_ids) - 1 - start
    experts = (np.arange(rows * L * K, dtype=np.int32) % 7).reshape(rows, L, K)
    body = {
        "text": "xx",
        "output_ids": list(out_ids),
        "meta_info": {
            "id": "r1",
            "finish_reason": {"type": "stop", "matched": 2},
            "prompt_tokens": prompt_len,
            "completion_tokens": len(out_ids),
            "output_token_logprobs": [[-0.5 * (i + 1), t, None] for i, t in enumerate(out_ids)],
            "routed_experts": base64.b64encode(experts.tobytes()).decode(),
        },
    }
    return body, experts


def test_sglang_response_decodes_exactly():
    body, experts = _hand_built_response(prompt_len=5, out_ids=[11, 12, 2], start=0)
    out = decode_generate_response(body, prompt_len=5, num_layers=2, topk=2, want_routed_experts=True)
    np.testing.assert_array_equal(out.output_ids, [11, 12, 2])
    np.testing.assert_array_equal(out.logprobs, np.array([-0.5, -1.0, -1.5], dtype=np.float32))
    assert out.routed_experts.shape == (7, 2, 2) and out.routed_experts.dtype == np.int32
    np.testing.assert_array_equal(out.routed_experts, experts)
    assert out.finish_reason == "stop"


def test_sglang_routed_experts_start_len_is_honoured():
    body, _ = _hand_built_response(prompt_len=10, out_ids=[1, 2, 3], start=6)
    out = decode_generate_response(body, prompt_len=10, routed_experts_start_len=6, num_layers=2, topk=2,
                                   want_routed_experts=True)
    assert out.routed_experts.shape[0] == 10 + 3 - 1 - 6
    with pytest.raises(FieldShapeError, match="expected 12"):
        decode_generate_response(body, prompt_len=10, routed_experts_start_len=0, num_layers=2, topk=2,
                                 want_routed_experts=True)


def test_sglang_dtype_tag_is_honoured():
    ids = np.array([[[1, 2]], [[3, 250]]], dtype=np.uint8)
    b64 = base64.b64encode(ids.tobytes()).decode()
    out = decode_routed_experts_b64(b64, 1, 2, dtype="uint8")
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, ids.astype(np.int32))
    assert decode_routed_experts_b64(encode_routed_experts_b64(out), 1, 2).tolist() == out.tolist()


@pytest.mark.parametrize("storage", ["uint8", "uint16", "int32"])
@pytest.mark.parametrize("wire", ["int32", "uint16"])
def test_routed_experts_decode_straight_into_the_storage_dtype(storage, wire):
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 200, size=(9, 3, 2)).astype(wire)
    b64 = base64.b64encode(ids.tobytes()).decode()
    out = decode_routed_experts_b64(b64, 3, 2, dtype=wire, storage_dtype=storage, num_experts=200)
    assert out.dtype == np.dtype(storage) and out.shape == (9, 3, 2)
    np.testing.assert_array_equal(out.astype(np.int64), ids.astype(np.int64))
    body, experts = _hand_built_response(prompt_len=5, out_ids=[11, 12, 2], start=0)
    dec = decode_generate_response(body, prompt_len=5, num_layers=2, topk=2, want_routed_experts=True,
                                   routed_experts_dtype=storage, num_experts=8)
    assert dec.routed_experts.dtype == np.dtype(storage)
    np.testing.assert_array_equal(dec.routed_experts.astype(np.int32), experts)


@pytest.mark.parametrize("bad, storage, num_experts", [(256, "uint8", None), (-1, "uint16", None),
                                                       (70_000, "uint16", None), (200, "uint8", 128)])
def test_direct_decode_still_range_checks_every_id(bad, storage, num_experts):
    ids = np.zeros((4, 2, 2), dtype=np.int32)
    ids[2, 1, 0] = bad
    b64 = base64.b64encode(ids.tobytes()).decode()
    with pytest.raises(ExpertIdRangeError, match=str(bad)) as err:
        decode_routed_experts_b64(b64, 2, 2, storage_dtype=storage, num_experts=num_experts)
    assert (err.value.row, err.value.layer, err.value.slot) == (2, 1, 0)


@pytest.mark.parametrize("mutate, err, msg", [
    (lambda b: b.pop("meta_info"), WireFormatError, "meta_info"),
    (lambda b: b["meta_info"].update(output_token_logprobs=[[-1.0, 11, None]]), FieldShapeError, "disagree"),
    (lambda b: b["meta_info"].update(output_token_logprobs=[[None, 11, None], [0.0, 12, None], [0.0, 2, None]]),
     WireFormatError, "null"),
    (lambda b: b["meta_info"].update(routed_experts="***"), WireFormatError, "base64"),
    (lambda b: b["meta_info"].update(routed_experts=base64.b64encode(b"abc").decode()), FieldShapeError, "multiple"),
    (lambda b: b["meta_info"].pop("routed_experts"), WireFormatError, "enable-return-routed-experts"),
])
def test_malformed_sglang_responses_are_typed_errors(mutate, err, msg):
    body, _ = _hand_built_response(prompt_len=5, out_ids=[11, 12, 2], start=0)
    mutate(body)
    with pytest.raises(err, match=msg):
        decode_generate_response(body, prompt_len=5, num_layers=2, topk=2, want_routed_experts=True)
