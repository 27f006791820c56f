"""The one R3 decoder (``RoutedExpertsStream``, fed as the body arrives by ``GenerateBodyReader``)
against a reference: ``binascii``'s strict decoder over the whole string, whole rows, the range check.

For every body, split into pieces anywhere (inside the key and the base64 string included), the
answer read piece by piece (its routing handed up as an array) and decoded by
``decode_generate_response`` gives the same arrays, bit for bit, or the same error (type and message)
as parsing the whole body and decoding its string with the reference; so does the string decoded
whole (the stream fed once).
"""

from __future__ import annotations

import base64
import binascii
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dressage.errors import DressageError, WireFormatError
from dressage.fields import r3_stream
from dressage.fields.r3 import check_row_bytes, encode_routed_experts
from dressage.fields.r3_stream import WIRE_DTYPES, RoutedExpertsSpec, RoutedExpertsStream
from dressage.fields.sglang import cut_keeps_nothing, decode_generate_response
from dressage.proxy import fastjson
from dressage.proxy.engines.r3_body import PLACEHOLDER, GenerateBodyReader

L, K, E = 3, 2, 8


def _ids(rows: int, seed: int = 0, high: int = E) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, high, size=(rows, L, K), dtype=np.int32)


def _body(rows: int = 5, *, b64: str | None = None, out: int = 3, sep: str = ":", extra: dict | None = None,
          r3_first: bool = False) -> bytes:
    if b64 is None:
        b64 = base64.b64encode(_ids(rows).tobytes()).decode()
    ids = list(range(10, 10 + out))
    meta = {"finish_reason": {"type": "stop"}, "prompt_tokens": rows + 1 - out, "completion_tokens": out,
            "weight_version": "3", "output_token_logprobs": [[-0.5, t, None] for t in ids], **(extra or {})}
    head = json.dumps({"text": "ok", "output_ids": ids})[:-1]
    meta_text = json.dumps(meta)[1:-1]
    r3 = f'"routed_experts"{sep}"{b64}"'
    inner = f"{r3}, {meta_text}" if r3_first else f"{meta_text}, {r3}"
    return f'{head}, "meta_info": {{{inner}}}}}'.encode()


def _reference_routing(text: str, spec: RoutedExpertsSpec, wire: str = "int32") -> np.ndarray:
    """What the whole string decodes to, by binascii's strict decoder; the decoder's errors, worded."""
    if wire not in WIRE_DTYPES:
        raise WireFormatError(f"routed_experts_dtype {wire!r} is not a known integer dtype")
    try:
        raw = binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise WireFormatError(f"routed_experts is not valid base64: {exc}") from exc
    itemsize = np.dtype(WIRE_DTYPES[wire]).itemsize
    check_row_bytes(len(raw), spec.num_layers, spec.topk, itemsize)
    ids = np.frombuffer(raw, dtype=WIRE_DTYPES[wire]).reshape(-1, spec.num_layers, spec.topk)
    return encode_routed_experts(ids, spec.storage_dtype, num_experts=spec.num_experts)


def _plain(body: bytes, spec: RoutedExpertsSpec, prompt_len: int):
    try:
        parsed = fastjson.loads(body)
    except ValueError:
        return ("error", WireFormatError, "not JSON")
    try:
        meta = parsed.get("meta_info") if isinstance(parsed, dict) else None
        if isinstance(meta, dict) and isinstance(meta.get("routed_experts"), str) \
                and not cut_keeps_nothing(meta, want_logprobs=True, want_routed_experts=True):
            meta["routed_experts"] = _reference_routing(meta["routed_experts"], spec,
                                                        str(meta.get("routed_experts_dtype", "int32")))
    except DressageError as exc:
        return ("error", type(exc), str(exc))
    return _decode(parsed, spec, prompt_len)


def _decode(parsed, spec: RoutedExpertsSpec, prompt_len: int):
    try:
        out = decode_generate_response(parsed, prompt_len=prompt_len, num_layers=spec.num_layers, topk=spec.topk,
                                       want_routed_experts=True, routed_experts_dtype=spec.storage_dtype,
                                       num_experts=spec.num_experts)
    except DressageError as exc:
        return ("error", type(exc), str(exc))
    return ("ok", out.routed_experts, out.output_ids, out.logprobs)


def _whole(body: bytes, spec: RoutedExpertsSpec, prompt_len: int):
    """The body parsed whole, its string decoded by ``decode_generate_response`` (the stream fed once)."""
    try:
        parsed = fastjson.loads(body)
    except ValueError:
        return ("error", WireFormatError, "not JSON")
    return _decode(parsed, spec, prompt_len)


def _streamed(body: bytes, spec: RoutedExpertsSpec, prompt_len: int, cuts: list[int]):
    reader = GenerateBodyReader(spec)
    at = 0
    for cut in sorted(set(cuts)) + [len(body)]:
        reader.feed(body[at:cut])
        at = cut
    try:
        parsed = reader.result("POST /generate")
    except WireFormatError as exc:
        if "not JSON" in str(exc):
            return ("error", WireFormatError, "not JSON"), reader
        return ("error", WireFormatError, str(exc)), reader
    except DressageError as exc:
        return ("error", type(exc), str(exc)), reader
    routed = parsed.get("meta_info", {}).get("routed_experts") if isinstance(parsed, dict) else None
    assert not isinstance(routed, RoutedExpertsStream) and not (isinstance(routed, str) and routed == PLACEHOLDER)
    return _decode(parsed, spec, prompt_len), reader


def _same(a, b) -> None:
    assert a[0] == b[0], (a, b)
    if a[0] == "error":
        assert a[1] is b[1] and a[2] == b[2], (a, b)
        return
    if a[1] is None or b[1] is None:
        assert a[1] is None and b[1] is None
        return
    assert a[1].dtype == b[1].dtype and a[1].shape == b[1].shape
    assert a[1].tobytes() == b[1].tobytes()
    assert a[1].flags.writeable == b[1].flags.writeable
    assert np.array_equal(a[2], b[2]) and np.array_equal(a[3], b[3])


SPECS = [RoutedExpertsSpec(L, K, "uint8", E), RoutedExpertsSpec(L, K, "uint16", None),
         RoutedExpertsSpec(L, K, "int32", E), RoutedExpertsSpec(L, K, "uint8", None)]


def _check_every_cut(body: bytes, spec: RoutedExpertsSpec, prompt_len: int, *, streamed: bool | None = None):
    want = _plain(body, spec, prompt_len)
    _same(_whole(body, spec, prompt_len), want)
    for cut in range(len(body) + 1):
        got, reader = _streamed(body, spec, prompt_len, [cut])
        _same(got, want)
        if streamed is not None:
            assert reader.streamed is streamed or got[0] == "error"
    # every byte its own piece
    got, _ = _streamed(body, spec, prompt_len, list(range(len(body))))
    _same(got, want)
    return want


@pytest.fixture(autouse=True)
def small_window(monkeypatch):
    monkeypatch.setattr(r3_stream, "STREAM_WINDOW", 7)  # decode steps inside even the smallest string


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.storage_dtype}-{s.num_experts}")
@pytest.mark.parametrize("rows", [5, 6, 7])  # 24, 48 or 84 bytes: every padding
def test_valid_bodies_are_identical_at_every_cut(spec, rows):
    want = _check_every_cut(_body(rows), spec, rows + 1 - 3, streamed=True)
    assert want[0] == "ok"
    reader = GenerateBodyReader(spec)
    reader.feed(_body(rows))
    body = reader.result("x")
    routed = body["meta_info"]["routed_experts"]  # handed up decoded, in the storage dtype
    assert isinstance(routed, np.ndarray) and routed.dtype == spec.storage_dtype
    assert routed.tobytes() == _ids(rows).astype(spec.storage_dtype).tobytes()


@pytest.mark.parametrize("sep", [" : ", "\n:\t", ":  ", " :"])
def test_whitespace_around_the_colon(sep):
    _check_every_cut(_body(5, sep=sep), SPECS[0], 3, streamed=True)


def test_r3_first_in_meta_and_other_keys_after():
    _check_every_cut(_body(5, r3_first=True, extra={"zz": [1, {"a": "b"}]}), SPECS[0], 3, streamed=True)


@pytest.mark.parametrize("b64", [
    "",                      # empty: zero rows (a row-count error here)
    "QUJD",                  # 3 bytes: not a row
    "AAAA====",              # excess padding
    "AA=A",                  # discontinuous padding
    "=AAA",                  # leading padding
    "AAAAA",                 # 1 more than a multiple of 4
    "AAA",                   # incorrect padding
    "AAAA AAA",              # whitespace inside
    "AAAA\\/AAA",            # a JSON escape: read the usual way
    "AAAA\\u0041AAA",
    "AAAAé===",              # not ASCII
    "AA==AAAA",              # padding before the end
])
def test_bad_base64_gives_the_plain_error(b64):
    for spec in SPECS:
        _check_every_cut(_body(b64=b64), spec, 3)


def test_out_of_range_and_negative_ids_give_the_plain_error():
    for value, where in ((E, (4, 2, 1)), (300, (0, 0, 0)), (-1, (2, 1, 0)), (70000, (4, 0, 1))):
        ids = _ids(5)
        ids[where] = value
        body = _body(b64=base64.b64encode(ids.tobytes()).decode())
        for spec in SPECS:
            want = _check_every_cut(body, spec, 3)
            high = min(np.iinfo(spec.storage_dtype).max, (spec.num_experts or 2**31) - 1)
            assert (want[0] == "error") == (not 0 <= value <= high), want


def test_rows_not_a_multiple_and_wrong_row_count():
    raw = _ids(5).tobytes()
    _check_every_cut(_body(b64=base64.b64encode(raw[:-4]).decode()), SPECS[0], 3)  # a row short by one id
    _check_every_cut(_body(b64=base64.b64encode(raw[:-2]).decode()), SPECS[0], 3)  # not whole int32s
    assert _check_every_cut(_body(5), SPECS[0], 4)[0] == "error"  # the answer's row count is checked


@pytest.mark.parametrize("tag", ["uint8", "int16", "int64", "float32"])
def test_other_wire_dtypes_read_after_the_string(tag):
    wire = np.dtype(tag) if tag != "float32" else np.dtype(np.int32)
    ids = _ids(5).astype(wire)
    body = _body(b64=base64.b64encode(ids.tobytes()).decode(), extra={"routed_experts_dtype": tag})
    for spec in SPECS:
        _check_every_cut(body, spec, 3)
    # the tag before the string as well
    body = _body(b64=base64.b64encode(ids.tobytes()).decode(), extra={"routed_experts_dtype": tag}, r3_first=True)
    _check_every_cut(body, SPECS[0], 3)


def test_truncated_bodies_are_not_json():
    body = _body(6)
    for end in range(len(body)):
        want = _plain(body[:end], SPECS[0], 4)
        got, _ = _streamed(body[:end], SPECS[0], 4, [end // 2])
        _same(got, want)
        assert got[0] == "error"


def test_missing_r3_and_no_meta():
    body = json.dumps({"text": "", "output_ids": [1], "meta_info": {
        "finish_reason": {"type": "stop"}, "output_token_logprobs": [[-1.0, 1, None]]}}).encode()
    want = _check_every_cut(body, SPECS[0], 1, streamed=False)
    assert want[0] == "error" and "routed_experts missing" in want[2]
    _check_every_cut(b'{"text": "x"}', SPECS[0], 1, streamed=False)
    _check_every_cut(b'[1, 2]', SPECS[0], 1, streamed=False)


def test_the_key_elsewhere_first_then_in_meta():
    """A nested "routed_experts" string before meta_info's: the placeholder lands elsewhere, so the
    body is read the usual way, both strings intact."""
    real = base64.b64encode(_ids(5, seed=1).tobytes()).decode()
    decoy = base64.b64encode(_ids(5, seed=2).tobytes()).decode()
    body = _body(b64=real, extra={"debug": {"routed_experts": decoy}}, r3_first=False)
    # "debug" comes before the real key in meta_info
    assert body.index(decoy.encode()) < body.index(real.encode())
    want = _check_every_cut(body, SPECS[0], 3)
    assert want[0] == "ok"
    reader = GenerateBodyReader(SPECS[0])
    reader.feed(body)
    parsed = reader.result("x")
    assert parsed["meta_info"]["debug"]["routed_experts"] == decoy
    assert parsed["meta_info"]["routed_experts"].tobytes() == _ids(5, seed=1).astype(np.uint8).tobytes()


def test_duplicate_keys_the_last_wins():
    first = base64.b64encode(_ids(5, seed=1).tobytes()).decode()
    last = base64.b64encode(_ids(5, seed=2).tobytes()).decode()
    body = _body(b64=first)[:-2] + f', "routed_experts": "{last}"}}}}'.encode()
    want = _check_every_cut(body, SPECS[0], 3)
    assert want[0] == "ok" and want[1].tobytes() == _ids(5, seed=2).astype(np.uint8).tobytes()
    # the whole meta_info twice: the last one wins
    body = _body(b64=first)[:-1] + b', "meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": [' \
        + b'[-0.5, 10, null], [-0.5, 11, null], [-0.5, 12, null]], "routed_experts": "' + last.encode() + b'"}}'
    want = _check_every_cut(body, SPECS[0], 3)
    assert want[0] == "ok" and want[1].tobytes() == _ids(5, seed=2).astype(np.uint8).tobytes()


def test_the_key_inside_strings_is_not_taken():
    b64 = base64.b64encode(_ids(5).tobytes()).decode()
    for text in ['say "routed_experts": "AAAA"', 'x\\', '\\"routed_experts"', 'routed_experts', '"routed_experts":']:
        body = _body(b64=b64, extra={"note": text, text: "v"})
        want = _check_every_cut(body, SPECS[0], 3)
        assert want[0] == "ok"


def test_the_key_with_a_non_string_value():
    body = _body(5, extra={"x": {"routed_experts": None}, "y": {"routed_experts" : [1]}})
    assert _check_every_cut(body, SPECS[0], 3)[0] == "ok"
    body = json.dumps({"output_ids": [1], "meta_info": {"routed_experts": None, "finish_reason": "abort",
                                                        "output_token_logprobs": []}}).encode()
    _check_every_cut(body, SPECS[0], 1, streamed=False)


def test_the_placeholder_is_never_left_in_an_answer():
    body = _body(5, extra={"debug": {"routed_experts": "QUJD"}})
    reader = GenerateBodyReader(SPECS[0])
    reader.feed(body)
    assert PLACEHOLDER.encode() not in json.dumps(reader.result("x"), default=lambda o: "array").encode()


@pytest.mark.parametrize("spec", SPECS + [RoutedExpertsSpec(L, K, "int32", None)],
                         ids=lambda s: f"{s.storage_dtype}-{s.num_experts}")
@pytest.mark.parametrize("wire", ["int32", "int16", "uint8"])
def test_stream_finish_matches_the_reference_for_every_wire_dtype(spec, wire):
    ids = _ids(6).astype(wire)
    b64 = base64.b64encode(ids.tobytes())
    for pieces in ([b64], [b64[:5], b64[5:]], [bytes([c]) for c in b64]):
        stream = RoutedExpertsStream(spec)
        for piece in pieces[:-1]:
            stream.feed(piece)
        stream.end(pieces[-1])
        try:
            got = ("ok", stream.finish(wire))
        except DressageError as exc:
            got = ("error", type(exc), str(exc))
        try:
            want = ("ok", _reference_routing(b64.decode(), spec, wire))
        except DressageError as exc:
            want = ("error", type(exc), str(exc))
        assert got[0] == want[0], (got, want)
        if got[0] == "ok":
            assert got[1].dtype == want[1].dtype and got[1].tobytes() == want[1].tobytes()
            assert got[1].flags.writeable == want[1].flags.writeable
        else:
            assert got[1:] == want[1:]
        unchecked = RoutedExpertsStream(spec)
        unchecked.end(b64)
        out = unchecked.finish(wire, checked=False)
        assert out.dtype == np.int32 and out.flags.writeable and np.array_equal(out, ids.astype(np.int32))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.storage_dtype}-{s.num_experts}")
@pytest.mark.parametrize("value", [E, -1, 70000])
def test_large_strings_with_an_id_out_of_range_give_the_reference_error(spec, value):
    """Strings past the vectorized decoders' threshold (decoded into arrays, not bytes), whole or in pieces."""
    ids = _ids(3000)
    ids[2999, 2, 1] = value
    b64 = base64.b64encode(ids.tobytes())
    try:
        want = ("ok", _reference_routing(b64.decode(), spec).tobytes())
    except DressageError as exc:
        want = ("error", type(exc), str(exc))
    for window in (4096, 128 * 1024):
        r3_stream.STREAM_WINDOW = window
        for pieces in ([b64], [b64[:30001], b64[30001:]]):
            stream = RoutedExpertsStream(spec)
            for piece in pieces[:-1]:
                stream.feed(piece)
            stream.end(pieces[-1])
            try:
                got = ("ok", stream.finish().tobytes())
            except DressageError as exc:
                got = ("error", type(exc), str(exc))
            assert got == want


def test_a_string_decoded_in_one_step_is_not_copied():
    """The stream fed the whole string keeps the decoder's array: int32 ids are a view of its bytes."""
    b64 = base64.b64encode(_ids(6).tobytes())
    stream = RoutedExpertsStream(RoutedExpertsSpec(L, K, "int32", E))
    stream.end(b64)
    out = stream.finish()
    assert out.base is not None and not out.flags.owndata and not out.flags.writeable
    assert out.tobytes() == _ids(6).tobytes()


_B64_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/= \\\"é\n"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(0, 9), high=st.sampled_from([E, 256, 300, 2**31]),
       noise=st.lists(st.tuples(st.integers(0, 400), st.sampled_from(list(_B64_CHARS))), max_size=2),
       cuts=st.lists(st.integers(0, 600), max_size=6), spec=st.sampled_from(SPECS),
       window=st.sampled_from([4, 5, 13, 64, 4096]))
def test_property_streamed_equals_plain(rows, high, noise, cuts, spec, window):
    r3_stream.STREAM_WINDOW = window
    b64 = list(base64.b64encode(_ids(rows, seed=rows, high=high).tobytes()).decode())
    for at, ch in noise:
        if b64:
            b64[at % len(b64)] = ch
    body = _body(rows, b64="".join(b64))
    want = _plain(body, spec, rows + 1 - 3)
    got, _ = _streamed(body, spec, rows + 1 - 3, [c % (len(body) + 1) for c in cuts])
    _same(got, want)
    _same(_whole(body, spec, rows + 1 - 3), want)


# -- through the client: the body fed as it arrives, or read whole ---------------------------------

import asyncio  # noqa: E402
import gzip  # noqa: E402

import httpx  # noqa: E402

from dressage.errors import EngineRequestError  # noqa: E402
from dressage.proxy.engines.sglang_client import SGLangClient  # noqa: E402


class _Pieces(httpx.AsyncByteStream):
    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size = data, size

    async def __aiter__(self):
        for i in range(0, len(self.data), self.size):
            yield self.data[i:i + self.size]


def _client_answer(handler, spec=SPECS[0]):
    async def go():
        async with SGLangClient("http://engine", transport=httpx.MockTransport(handler)) as client:
            return await client.generate([1, 2, 3], {}, return_routed_experts=True, routed_experts_spec=spec)
    return asyncio.run(go())


def test_client_decodes_the_body_as_it_arrives():
    body = _body(6)
    answer = _client_answer(lambda request: httpx.Response(200, stream=_Pieces(body, 5)))
    assert isinstance(answer["meta_info"]["routed_experts"], np.ndarray)
    assert answer["meta_info"]["routed_experts"].dtype == np.uint8
    _same(_decode(answer, SPECS[0], 4), _plain(body, SPECS[0], 4))
    bad = _body(b64=base64.b64encode(_ids(6, high=300).tobytes()).decode())  # ids beyond 8 experts
    with pytest.raises(DressageError) as info:
        _client_answer(lambda request: httpx.Response(200, stream=_Pieces(bad, 5)))
    want = _plain(bad, SPECS[0], 4)
    assert want[0] == "error" and (type(info.value), str(info.value)) == want[1:]


def test_client_compressed_body_and_error_status():
    body = _body(6)
    answer = _client_answer(lambda request: httpx.Response(200, content=gzip.compress(body),
                                                           headers={"content-encoding": "gzip"}))
    _same(_decode(answer, SPECS[0], 4), _plain(body, SPECS[0], 4))
    with pytest.raises(EngineRequestError, match="bad input"):
        _client_answer(lambda request: httpx.Response(400, json={"error": {"message": "bad input"}}))
    with pytest.raises(WireFormatError, match="not JSON"):
        _client_answer(lambda request: httpx.Response(200, stream=_Pieces(body[:-3], 7)))


def test_text_gives_back_the_characters_exactly():
    """Padding with set bits that decoding drops ("QR==" decodes as "QQ=="): the rebuilt body has them."""
    for b64 in ("AAAAQR==", "AAAAAAAAQUJ=", "AAAAAAAAAAAA", "QUJDQR=="):
        for window in (4, 5, 6, 4096):
            r3_stream.STREAM_WINDOW = window
            stream = RoutedExpertsStream(SPECS[0])
            for ch in b64:
                stream.feed(ch.encode())
            stream.end()
            assert not stream.gave_up and stream.text() == b64.encode()
    # and in a body that is then read the usual way (a duplicate key wins)
    body = _body(b64="AAAAQR==")[:-2] + b', "routed_experts": "AAAA"}, "x": 1}'
    reader = GenerateBodyReader(SPECS[0])
    reader.feed(body)
    assert bytes(reader._original()) == body
    reader = GenerateBodyReader(SPECS[0])
    reader.feed(body + b"]")  # not JSON: the error quotes the body as it came
    with pytest.raises(WireFormatError):
        reader.result("x")


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(0, 7), cut=st.integers(0, 400), pad_bits=st.integers(0, 15), window=st.sampled_from([4, 9, 4096]))
def test_property_the_body_rebuilt_is_the_body(rows, cut, pad_bits, window):
    r3_stream.STREAM_WINDOW = window
    b64 = base64.b64encode(_ids(rows).tobytes()).decode()
    if b64.endswith("=="):  # set the bits the padding hides
        b64 = b64[:-3] + "AQgw"[pad_bits % 4] + "=="
    body = _body(rows, b64=b64)
    reader = GenerateBodyReader(SPECS[0])
    cut %= len(body) + 1
    reader.feed(body[:cut])
    reader.feed(body[cut:])
    assert reader.streamed or not b64
    assert bytes(reader._original()) == body
