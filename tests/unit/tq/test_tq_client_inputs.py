"""Bad client input is refused the same way on every deployment, before anything is sent or stored, and
empty arrays of any shape are stored and read back on every deployment.

One check in the client serves all of them: the embedded deployment (in-process units), a ZMQ client of an
embedded deployment, and a ``local`` one (unit and Controller processes)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dressage.errors import TransferQueueError
from dressage.tq import FieldRef, TransferQueue, TransferQueueClient
from dressage.tq.transport.wire import MAX_KEY_BYTES, MAX_TEXT

_names = itertools.count()


@pytest.fixture(scope="module")
def embedded():
    with TransferQueue.start({"num_storage_units": 2, "unit_memory_budget": "16MiB", "retention_s": None}) as tq:
        yield tq


@pytest.fixture(scope="module")
def local():
    config = {"deployment": "local", "unit_memory_budget": "16MiB", "request_timeout_s": 5, "retention_s": None}
    with TransferQueue.start(config) as tq:
        yield tq


@pytest.fixture(params=["embedded", "zmq", "local"])
def deployment(request):
    """``(tq, client)``: ``zmq`` is a client of the embedded deployment that reaches it through sockets."""
    if request.param == "local":
        tq = request.getfixturevalue("local")
        client = tq.client()
    else:
        tq = request.getfixturevalue("embedded")
        client = tq.client() if request.param == "embedded" else TransferQueueClient.connect(tq.client_spec())
    try:
        yield tq, client
    finally:
        client.close()


def _stored(tq) -> tuple[int, int]:
    """Keys in the directory and in the units."""
    return tq.total_keys(), sum(s["keys"] for s in tq.stats().values())


def _key(tag: str) -> str:
    return f"{tag}-{next(_names)}"


# -- a bare string where a list of keys or refs goes ------------------------------------------------------


@pytest.mark.parametrize("bad", ["step", b"step", None, 7, "s"], ids=["str", "bytes", "none", "int", "one-char"])
def test_a_bare_string_or_non_list_of_keys_is_refused_and_deletes_nothing(deployment, bad):
    tq, client = deployment
    # Keys named like the characters of "step": a bare string must not reach them one character each.
    refs = [client.put("logprobs", np.ones(4, np.float32), key=k, batch="chars") for k in ("s", "t", "e", "p")]
    try:
        before = _stored(tq)
        for call, what in ((client.delete, "delete"), (client.mark_consumed, "mark_consumed"),
                           (lambda k: client.set_batch(k, "other"), "set_batch")):
            with pytest.raises(TransferQueueError, match=what):
                call(bad)
        assert _stored(tq) == before
        for ref in refs:
            np.testing.assert_array_equal(client.get(ref), np.ones(4, np.float32))
    finally:
        assert client.delete(refs) == 4


def test_a_single_ref_or_a_list_of_non_keys_is_refused(deployment):
    tq, client = deployment
    ref = client.put("logprobs", np.ones(4, np.float32))
    try:
        with pytest.raises(TransferQueueError, match="wrap a single one in a list"):
            client.delete(ref)
        with pytest.raises(TransferQueueError, match="delete takes FieldRefs or key strings, got float"):
            client.delete([3.5])
        with pytest.raises(TransferQueueError, match="mark_consumed: key must be a non-empty"):
            client.mark_consumed([""])
        np.testing.assert_array_equal(client.get(ref), np.ones(4, np.float32))
    finally:
        assert client.delete([ref]) == 1


@pytest.mark.parametrize("keys", ["s7", b"s7", 7], ids=["str", "bytes", "int"])
def test_put_many_keys_must_be_a_list(deployment, keys):
    tq, client = deployment
    before = _stored(tq)
    items = [("logprobs", np.ones(2, np.float32)), ("routed_experts", np.ones((1, 2, 2), np.uint8))]
    with pytest.raises(TransferQueueError, match="put_many keys must be a list of key strings"):
        client.put_many(items, keys=keys)
    assert _stored(tq) == before


def test_set_batch_takes_a_string_batch_or_none(deployment):
    tq, client = deployment
    batch = _key("moved")
    ref = client.put("logprobs", np.ones(4, np.float32), batch=_key("from"))
    try:
        for bad in (5, b"b", ["b"]):
            with pytest.raises(TransferQueueError, match="set_batch batch must be a string"):
                client.set_batch([ref], bad)
        # Still in its first batch: moved once a valid name is given, then clear finds it there.
        assert client.set_batch([ref], batch) == 1
        assert client.clear(batch) == 1
    finally:
        client.delete([ref])


# -- names: the wire's bounds and UTF-8, checked in the client ----------------------------------------------


def test_key_field_and_batch_bounds_are_checked_before_anything_is_sent(deployment):
    tq, client = deployment
    before = _stored(tq)
    arr = np.ones(1000, np.float32)
    cases = [
        (dict(key="k" * (MAX_KEY_BYTES + 1)), f"key must be a non-empty string of at most {MAX_KEY_BYTES} characters, "
                                              f"got a string of {MAX_KEY_BYTES + 1} characters"),
        (dict(batch="b" * 20_000_000), f"batch must be a string of at most {MAX_TEXT} characters"),
        (dict(key="rollout-\udc80"), "key 'rollout-\\\\udc80' is not UTF-8 text"),
        (dict(batch="rollout-\udc80"), "batch 'rollout-\\\\udc80' is not UTF-8 text"),
    ]
    for kwargs, message in cases:
        with pytest.raises(TransferQueueError, match=message):
            client.put("logprobs", arr, **kwargs)
    with pytest.raises(TransferQueueError, match=f"field must be a non-empty string of at most {MAX_KEY_BYTES}"):
        client.put("f" * (MAX_KEY_BYTES + 1), arr)
    with pytest.raises(TransferQueueError, match="field 'x\\\\ud800' is not UTF-8 text"):
        client.put_many([("logprobs", arr), ("x\ud800", arr)])
    with pytest.raises(TransferQueueError, match="clear batch 'b\\\\udfff' is not UTF-8 text"):
        client.clear("b\udfff")
    with pytest.raises(TransferQueueError, match="clear batch must be a string of at most"):
        client.clear("b" * (MAX_TEXT + 1))
    with pytest.raises(TransferQueueError, match="set_batch batch 'b\\\\udfff' is not UTF-8 text"):
        client.set_batch(["some-key"], "b\udfff")
    with pytest.raises(TransferQueueError, match="delete: key 'k\\\\ud800' is not UTF-8 text"):
        client.delete(["k\ud800"])
    assert _stored(tq) == before


def test_names_at_the_bounds_are_stored(deployment):
    tq, client = deployment
    key, field, batch = _key("k").ljust(MAX_KEY_BYTES, "k"), "f" * MAX_KEY_BYTES, "b" * MAX_TEXT
    ref = client.put(field, np.arange(3, dtype=np.int32), key=key, batch=batch)
    assert (ref.key, ref.field, ref.batch) == (key, field, batch)
    np.testing.assert_array_equal(client.get(ref), np.arange(3, dtype=np.int32))
    assert client.clear(batch) == 1


# -- empty arrays -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,dtype", [((0, 4, 2), np.uint8), ((5, 0), np.int32), ((0,), np.float32),
                                         ((0, 0, 3), np.float64)])
def test_empty_arrays_of_any_shape_round_trip(deployment, shape, dtype):
    tq, client = deployment
    batch = _key("empty")
    empty = np.zeros(shape, dtype)
    ref = client.put("routed_experts", empty, batch=batch)
    assert (ref.dtype, ref.shape) == (np.dtype(dtype).name, shape)
    got = client.get(ref)
    assert (got.dtype, got.shape) == (np.dtype(dtype), shape)
    lp, r3 = client.put_many([("logprobs", np.arange(3, dtype=np.float32)), ("routed_experts", empty)], batch=batch)
    got_lp, got_r3 = client.get_many([lp, r3])
    np.testing.assert_array_equal(got_lp, np.arange(3, dtype=np.float32))
    assert (got_r3.dtype, got_r3.shape) == (np.dtype(dtype), shape)
    assert client.clear(batch) == 3


def test_an_empty_row_range_of_a_multi_dimensional_blob_reads_back(deployment):
    tq, client = deployment
    r3 = np.arange(40, dtype=np.uint8).reshape(5, 4, 2)
    ref = client.put("routed_experts", r3)
    try:
        none, whole = client.get_many([ref.narrow(2, 2), ref])
        assert none.shape == (0, 4, 2) and none.dtype == np.uint8
        np.testing.assert_array_equal(whole, r3)
    finally:
        client.delete([ref])


def test_a_forged_ref_with_an_oversized_key_is_refused_on_delete(embedded):
    # A FieldRef whose key the client would refuse is refused on delete too, before the Controller is asked.
    client = embedded.client()
    forged = FieldRef("k" * (MAX_KEY_BYTES + 1), "unit0", "logprobs", "float32", (3,))
    with pytest.raises(TransferQueueError, match="delete: key must be a non-empty string"):
        client.delete([forged])
