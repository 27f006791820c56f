"""PutBatcher: concurrent puts merge into few put_many rounds, each step all or nothing; two rounds go out
at once and resolve in the order they were formed."""

import threading

import numpy as np
import pytest

from dressage.errors import TransferQueueError
from dressage.tq.client.batching import PutBatcher
from clocks import eventually


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
    batcher = PutBatcher(client, rounds_in_flight=1)
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
    batcher = PutBatcher(client, max_items=2, rounds_in_flight=1)
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
    batcher = PutBatcher(client, rounds_in_flight=1)
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
    with pytest.raises(TransferQueueError, match="rounds_in_flight"):
        PutBatcher(client, rounds_in_flight=0)


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


class _Held:
    """A client whose every round waits for its own release (by its first key) and answers with its keys."""

    def __init__(self):
        self.lock = threading.Lock()
        self.entered, self.gates, self.finished = [], {}, []
        self.wire = self.most = 0

    def gate(self, key):
        with self.lock:
            return self.gates.setdefault(key, threading.Event())

    def put_many(self, items, *, batch=None, keys=None):
        with self.lock:
            self.entered.append(keys[0])
            self.wire += 1
            self.most = max(self.most, self.wire)
        self.gate(keys[0]).wait(10)
        with self.lock:
            self.wire -= 1
            self.finished.append(keys[0])
        if keys[0].startswith("bad"):
            raise TransferQueueError(f"unit u1 refused {keys[0]}")
        return list(keys)


def test_two_rounds_are_on_the_wire_at_once_and_resolve_in_the_order_they_were_formed():
    client = _Held()
    batcher = PutBatcher(client)  # two rounds in flight by default
    resolved = []
    try:
        a = batcher.submit(_step(0), keys=["a/lp", "a/r3"])
        eventually(lambda: client.entered == ["a/lp"])
        b = batcher.submit(_step(1), keys=["b/lp", "b/r3"])
        eventually(lambda: client.entered == ["a/lp", "b/lp"])  # a second round goes out while the first waits
        c = batcher.submit(_step(2), keys=["c/lp", "c/r3"])
        d = batcher.submit(_step(3), keys=["d/lp", "d/r3"])
        for name, f in zip("abcd", (a, b, c, d)):
            f.add_done_callback(lambda f, name=name: resolved.append(name))
        assert batcher.pending() == 4
        client.gate("b/lp").set()  # the second round is answered first ...
        eventually(lambda: client.finished == ["b/lp"])
        assert not b.done() and resolved == []  # ... and waits for the first, which is still on the wire
        assert client.entered == ["a/lp", "b/lp"]  # both slots stay taken until they resolve
        client.gate("a/lp").set()
        assert a.result(5) == ["a/lp", "a/r3"] and b.result(5) == ["b/lp", "b/r3"]
        eventually(lambda: client.entered == ["a/lp", "b/lp", "c/lp"])  # c and d queued together: one round
        client.gate("c/lp").set()
        assert c.result(5) == ["c/lp", "c/r3"] and d.result(5) == ["d/lp", "d/r3"]
        assert resolved == ["a", "b", "c", "d"] and client.most == 2
        assert batcher.rounds == 3 and batcher.steps == 4 and batcher.flush(5) and batcher.pending() == 0
    finally:
        for key in ("a/lp", "b/lp", "c/lp"):
            client.gate(key).set()
        batcher.close()


def test_a_round_that_fails_beside_another_fails_only_its_own_steps_in_order():
    client = _Held()
    batcher = PutBatcher(client)
    resolved = []
    try:
        ok = batcher.submit(_step(0), keys=["ok/lp", "ok/r3"])
        eventually(lambda: client.entered == ["ok/lp"])
        bad = batcher.submit(_step(1), keys=["bad/lp", "bad/r3"])
        eventually(lambda: client.entered == ["ok/lp", "bad/lp"])
        for name, f in (("ok", ok), ("bad", bad)):
            f.add_done_callback(lambda f, name=name: resolved.append(name))
        client.gate("bad/lp").set()
        eventually(lambda: client.finished == ["bad/lp"])
        assert not bad.done()
        client.gate("ok/lp").set()
        assert ok.result(5) == ["ok/lp", "ok/r3"]
        with pytest.raises(TransferQueueError, match="refused bad/lp"):
            bad.result(5)
        assert resolved == ["ok", "bad"] and batcher.rounds == 1 and batcher.steps == 1
        client.gate("later/lp").set()
        assert batcher.submit(_step(2), keys=["later/lp", "later/r3"]).result(5) == ["later/lp", "later/r3"]
    finally:
        for key in ("ok/lp", "bad/lp", "later/lp"):
            client.gate(key).set()
        batcher.close()


def test_close_waits_for_both_rounds_in_flight(tq):
    client = _Gated(tq.client())
    batcher = PutBatcher(client)
    first = batcher.submit(_step(0), keys=["p/lp", "p/r3"])
    assert client.entered.wait(5)
    second = batcher.submit(_step(1), keys=["q/lp", "q/r3"])
    closing = threading.Thread(target=batcher.close)
    closing.start()
    client.gate.set()
    closing.join(10)
    assert not closing.is_alive() and first.done() and second.done()
    assert [r.key for r in first.result() + second.result()] == ["p/lp", "p/r3", "q/lp", "q/r3"]
    assert tq.total_keys() == 4
