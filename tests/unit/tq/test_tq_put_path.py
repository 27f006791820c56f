"""One put path: each fast write (in-process, on a placement lease) and the put batcher store and answer
exactly what the plain placed write does for the same puts."""

from __future__ import annotations

import time

import numpy as np

from dressage.tq import TransferQueue, TransferQueueClient
from dressage.tq.client.batching import PutBatcher
from dressage.tq.client.inproc import InProcess
from dressage.tq.client.leases import LeasedWrite
from dressage.tq.directory.entries import KeyState

_UNIT_FIELDS = ("keys", "bytes", "puts", "bytes_written", "directory_keys", "directory_bytes", "pending")


def _puts(client: TransferQueueClient, tag: str) -> list:
    """The same mix of puts for every client: one field, converted inputs, several fields, a given key."""
    refs = [client.put("logprobs", np.linspace(-1, 0, 300, dtype=np.float32), batch="b")]
    refs.append(client.put("tokens", np.arange(40, dtype=np.int64).reshape(10, 4)[:, ::2]))  # not contiguous
    refs.append(client.put("lens", [[1, 2], [3, 4]], batch="b"))                                # a list
    refs.append(client.put("swapped", np.arange(6, dtype=">i4")))                              # byte order
    refs += client.put_many([("logprobs", np.full(7, 0.5, np.float32)),
                             ("routed_experts", np.arange(60, dtype=np.uint8).reshape(5, 3, 4))], batch="b")
    refs.append(client.put("given", np.ones((2, 2), np.float64), key=f"{tag}-given"))
    return refs


def _same_refs(fast: list, plain: list) -> None:
    for a, b in zip(fast, plain, strict=True):
        assert (a.unit_id, a.field, a.dtype, a.shape, a.batch, a.row_start, a.row_stop, a.nbytes) == \
               (b.unit_id, b.field, b.dtype, b.shape, b.batch, b.row_start, b.row_stop, b.nbytes)


def _unit_rows(tq: TransferQueue) -> dict:
    return {uid: {k: row[k] for k in _UNIT_FIELDS} for uid, row in tq.stats().items()}


def _eventually(check, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.005)
    return check()


def test_the_in_process_write_stores_and_answers_the_same_as_the_placed_write():
    config = {"retention_s": None}
    with TransferQueue.start(config) as fast_tq, TransferQueue.start(config) as plain_tq:
        fast = fast_tq.client()
        plain = TransferQueueClient(plain_tq.controller, plain_tq.storage_units(), fast_writes=False)
        assert isinstance(fast._fast_write, InProcess) and plain._fast_write is None
        fast_refs, plain_refs = _puts(fast, "k"), _puts(plain, "k")
        _same_refs(fast_refs, plain_refs)
        for got, want in zip(fast.get_many(fast_refs), plain.get_many(plain_refs), strict=True):
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype
        assert [fast_tq.controller.state(r.key) for r in fast_refs] == [KeyState.WRITTEN] * len(fast_refs)
        assert [plain_tq.controller.state(r.key) for r in plain_refs] == [KeyState.WRITTEN] * len(plain_refs)
        assert fast.counters == plain.counters
        assert _unit_rows(fast_tq) == _unit_rows(plain_tq)
        plain.close()


def test_the_leased_write_stores_and_answers_the_same_as_the_placed_write():
    config = {"retention_s": None, "unit_memory_budget": "64MiB"}
    with TransferQueue.start(config) as fast_tq, TransferQueue.start(config) as plain_tq:
        fast = TransferQueueClient.connect(fast_tq.client_spec())
        plain = TransferQueueClient.connect(plain_tq.client_spec(), fast_writes=False)
        try:
            assert isinstance(fast._fast_write, LeasedWrite) and plain._fast_write is None
            fast_refs, plain_refs = _puts(fast, "k"), _puts(plain, "k")
            assert fast._fast_write.granted == 1  # the puts did go through the lease
            _same_refs(fast_refs, plain_refs)
            for got, want in zip(fast.get_many(fast_refs), plain.get_many(plain_refs), strict=True):
                np.testing.assert_array_equal(got, want)
                assert got.dtype == want.dtype
            for tq, refs in ((fast_tq, fast_refs), (plain_tq, plain_refs)):  # commits are one-way
                assert _eventually(lambda: all(tq.controller.state(r.key) is KeyState.WRITTEN for r in refs))
            assert fast.counters == plain.counters
            fast._fast_write.close()  # the lease's rest goes back: the units' accounting must then agree
            assert _eventually(lambda: _unit_rows(fast_tq) == _unit_rows(plain_tq))
        finally:
            fast.close()
            plain.close()


def test_batched_puts_store_and_answer_the_same_as_plain_put_many():
    with TransferQueue.start({"retention_s": None}) as tq:
        client = tq.client()
        steps = [[("logprobs", np.full(4, -i, np.float32)), ("routed_experts", np.full((5, 2, 2), i, np.uint8))]
                 for i in range(6)]
        batcher = PutBatcher(client)
        futures = [batcher.submit(items, keys=[f"q{i}/lp", f"q{i}/r3"], batch="b") for i, items in enumerate(steps)]
        batched = [f.result(10) for f in futures]
        batcher.close()
        plain = [client.put_many(items, keys=[f"p{i}/lp", f"p{i}/r3"], batch="b") for i, items in enumerate(steps)]
        for got_refs, want_refs in zip(batched, plain, strict=True):
            _same_refs(got_refs, want_refs)
            for got, want in zip(client.get_many(got_refs), client.get_many(want_refs), strict=True):
                np.testing.assert_array_equal(got, want)
        keys = [r.key for refs in batched + plain for r in refs]
        assert all(tq.controller.state(k) is KeyState.WRITTEN for k in keys)
        assert sorted(tq.controller.keys("b")) == sorted(keys)
