"""PutBatcher: concurrent puts merge into few put_many rounds, each step all or nothing."""

import threading

import numpy as np
import pytest

from dressage.errors import TransferQueueError
from dressage.tq.client.batching import PutBatcher


class _Gated:
    """A real client whose puts wait for ``gate`` and are counted; ``fail`` makes the next round fail."""

    def __init__(self, inner):
        self.inner, self.gate, self.calls, self.fail = inner, threading.Event(), [], False
        self.entered = threading.Event()

    def put_many(self, items, *, batch=None, keys=None):
        self.entered.set()
        self.gate.wait(10)
        self.calls.append((batch, list(keys)))
        if self.fail:
            self.fail = False
            raise TransferQueueError("unit u0 did not answer")
        return self.inner.put_many(items, batch=batch, keys=keys)


def _step(i):
    return [("logprobs", np.full(4, -i, np.float32)), ("routed_experts", np.full((5, 2, 2), i, np.uint8))]


def test_puts_queued_during_a_round_go_out_together_and_each_gets_its_refs(tq):
    client = _Gated(tq.client())
    batcher = PutBatcher(client)
    first = batcher.submit(_step(0), keys=["s0/lp", "s0/r3"], batch="rollout-0")
    assert client.entered.wait(5)  # round 1 is on the wire: the next ones queue behind it
    rest = [batcher.submit(_step(i), keys=[f"s{i}/lp", f"s{i}/r3"], batch="rollout-0") for i in range(1, 6)]
    client.gate.set()
    refs = [f.result(10) for f in [first, *rest]]
    assert len(client.calls) == 2 and len(client.calls[1][1]) == 10  # 6 steps in 2 rounds
    assert batcher.rounds == 2 and batcher.steps == 6
    for i, (lp, r3) in enumerate(refs):
        assert (lp.key, r3.key) == (f"s{i}/lp", f"s{i}/r3") and lp.batch == "rollout-0"
        got_lp, got_r3 = tq.client().get_many([lp, r3])
        np.testing.assert_array_equal(got_lp, np.full(4, -i, np.float32))
        np.testing.assert_array_equal(got_r3, np.full((5, 2, 2), i, np.uint8))
    batcher.close()


def test_rounds_keep_batch_tags_apart_and_respect_the_size_bound(tq):
    client = _Gated(tq.client())
    batcher = PutBatcher(client, max_items=2)
    futures = [batcher.submit(_step(0), keys=["a/lp", "a/r3"], batch="rollout-0")]
    assert client.entered.wait(5)
    futures += [batcher.submit(_step(1), keys=["b/lp", "b/r3"], batch="rollout-1"),
                batcher.submit(_step(2), keys=["c/lp", "c/r3"], batch="rollout-0"),
                batcher.submit(_step(3), keys=["d/lp", "d/r3"], batch="rollout-1"),
                batcher.submit(_step(4), keys=["e/lp", "e/r3"], batch="rollout-1")]
    client.gate.set()
    for f in futures:
        f.result(10)
    rounds = [(b, [k.split("/")[0] for k in keys[::2]]) for b, keys in client.calls]
    assert rounds == [("rollout-0", ["a"]), ("rollout-1", ["b", "d"]), ("rollout-0", ["c"]),
                      ("rollout-1", ["e"])]
    assert {r.batch for f in futures for r in f.result()} == {"rollout-0", "rollout-1"}
    batcher.close()


def test_a_failed_round_fails_every_step_in_it_and_leaves_nothing(tq):
    client = _Gated(tq.client())
    batcher = PutBatcher(client)
    first = batcher.submit(_step(0), keys=["ok/lp", "ok/r3"])
    assert client.entered.wait(5)  # round 1 waits on the gate; the next three form round 2
    doomed = [batcher.submit(_step(i), keys=[f"x{i}/lp", f"x{i}/r3"]) for i in range(1, 4)]
    real = client.inner.put_many

    def fail_round_two(items, *, batch=None, keys=None):
        if keys[0].startswith("x"):
            raise TransferQueueError("unit u0 did not answer")
        return real(items, batch=batch, keys=keys)

    client.inner.put_many = fail_round_two
    client.gate.set()
    assert [r.key for r in first.result(10)] == ["ok/lp", "ok/r3"]
    for f in doomed:
        with pytest.raises(TransferQueueError, match="did not answer"):
            f.result(10)
    assert batcher.rounds == 1 and len(client.calls) == 2
    assert tq.total_keys() == 2  # only the first step's keys
    later = batcher.submit(_step(9), keys=["y/lp", "y/r3"])  # the writer goes on after a failure
    assert len(later.result(10)) == 2 and tq.total_keys() == 4
    batcher.close()


def test_close_sends_what_is_queued_then_refuses_more(tq):
    client = _Gated(tq.client())
    client.gate.set()
    batcher = PutBatcher(client)
    futures = [batcher.submit(_step(i), keys=[f"k{i}/lp", f"k{i}/r3"]) for i in range(4)]
    batcher.close()
    assert all(f.done() and not f.exception() for f in futures)
    assert tq.total_keys() == 8
    with pytest.raises(TransferQueueError, match="closed"):
        batcher.submit(_step(5), keys=["z/lp", "z/r3"])
    with pytest.raises(TransferQueueError, match="one key per item"):
        PutBatcher(client).submit(_step(1), keys=["only-one"])


def test_an_idle_writer_holds_no_step_arrays():
    """Once a round resolved, nothing of it stays alive on the writer thread while it waits for more."""
    import gc
    import weakref

    class _Keeps:  # answers like a client and keeps no array
        def put_many(self, items, *, batch=None, keys=None):
            return list(keys)

    batcher = PutBatcher(_Keeps())
    try:
        arrays = [np.zeros(1 << 20, np.uint8), np.ones(8, np.float32)]
        watch = [weakref.ref(a) for a in arrays]
        assert batcher.submit([("r3", arrays[0]), ("lp", arrays[1])], keys=["a", "b"]).result(10) == ["a", "b"]
        assert batcher.flush(10)
        del arrays
        gc.collect()
        assert [w() for w in watch] == [None, None]
    finally:
        batcher.close()
