"""Retention renewal: ``touch`` keeps a held key out of the retention sweep, and ``KeyRenewal`` touches what
its holder names every quarter of ``retention_s`` and what it hands on at once."""

import threading
import time

import numpy as np
import pytest

from dressage.errors import StorageUnitUnavailable, TransferQueueError
from dressage.tq import TransferQueue
from dressage.tq.client.renewal import RENEW_SHARE, KeyRenewal
from dressage.tq.directory.controller import Controller
from dressage.tq.directory.entries import KeyState, UnitInfo
from clocks import FakeClock, eventually


def test_touch_restarts_a_keys_retention_and_an_untouched_key_still_expires():
    clock = FakeClock()
    ctl = Controller([UnitInfo("u0")], retention_s=10, clock=clock)
    for key in ("held", "nobody"):
        ctl.place(key, 10)
        ctl.commit(key)
    clock.now = 8.0
    assert ctl.touch(["held", "gone"]) == 1
    clock.now = 10.5
    assert ctl.expire() == {"u0": ["nobody"]}
    assert ctl.state("held") is KeyState.WRITTEN
    clock.now = 17.5
    assert ctl.touch(["held"]) == 1  # renewed again before its retention ran out
    clock.now = 27.0
    assert ctl.expire() == {} and ctl.retention() == 10
    clock.now = 27.6
    assert ctl.expire() == {"u0": ["held"]}


def test_the_client_touches_a_page_at_a_time_and_says_the_retention():
    with TransferQueue.start({"deployment": "embedded", "retention_s": 30}) as tq:
        client = tq.client()
        refs = [client.put("logprobs", np.zeros(2, np.float32)) for _ in range(3)]
        assert client.touch(refs + [refs[0].key, "never"]) == 3  # FieldRefs or keys, each once
        assert client.retention() == 30.0
        with pytest.raises(TransferQueueError, match="touch"):
            client.touch(refs[0].key)  # a bare string would name each of its characters
    with TransferQueue.start({"deployment": "embedded", "retention_s": None}) as tq:
        assert tq.client().retention() is None


class _Client:
    """Records touches; ``retention()`` answers ``retention_s``."""

    def __init__(self, retention_s, fail=0, unanswered=0):
        self.retention_s, self.fail, self.unanswered = retention_s, fail, unanswered
        self.touched: list[list[str]] = []
        self.lock = threading.Lock()

    def retention(self):
        with self.lock:
            if self.unanswered:
                self.unanswered -= 1
                raise StorageUnitUnavailable("controller out of reach")
        return self.retention_s

    def touch(self, keys):
        with self.lock:
            if self.fail:
                self.fail -= 1
                raise StorageUnitUnavailable("controller out of reach")
            self.touched.append(list(keys))
        return len(keys)

    def rounds_with(self, key):
        with self.lock:
            return sum(key in keys for keys in self.touched)


def test_key_renewal_touches_the_held_keys_every_round_and_a_hand_off_at_once():
    client = _Client(retention_s=1.0 * RENEW_SHARE)  # a round every second
    held = ["a", "b", "a"]
    renewal = KeyRenewal(client, lambda: list(held))
    renewal.start()
    try:
        eventually(lambda: client.rounds_with("a") >= 1)  # the first round comes at once
        assert client.touched[0] == ["a", "b"] and renewal.period_s == pytest.approx(1.0)
        renewal.hand_off(["handed"])
        eventually(lambda: client.rounds_with("handed") == 1)  # without waiting for the next round
        assert client.rounds_with("a") == 1  # a hand-off touches only what was handed on
        held[:] = ["c"]
        eventually(lambda: client.rounds_with("c") >= 1)
        assert renewal.rounds >= 2 and renewal.renewed >= 4
    finally:
        renewal.close()
    n = len(client.touched)
    renewal.hand_off(["late"])
    renewal.start()
    time.sleep(0.05)
    assert len(client.touched) == n and client.rounds_with("late") == 0  # closed: nothing more


def test_a_failed_round_is_counted_and_the_next_one_renews():
    client = _Client(retention_s=0.1 * RENEW_SHARE, fail=1)
    renewal = KeyRenewal(client, lambda: ["k"])
    renewal.start()
    try:
        eventually(lambda: client.rounds_with("k") >= 1)
        assert renewal.failures == 1
    finally:
        renewal.close()


def test_without_retention_nothing_is_renewed_and_nothing_handed_off_is_kept():
    client = _Client(retention_s=None)
    renewal = KeyRenewal(client, lambda: ["k"])
    renewal.start()
    eventually(lambda: not renewal._thread.is_alive())
    renewal.hand_off(["x"] * 1000)
    assert client.touched == [] and renewal.period_s is None
    assert renewal._handed == []  # an acknowledged session's keys are not held in memory for nothing
    renewal.close()


def test_a_controller_that_cannot_say_its_retention_at_first_is_asked_again(monkeypatch):
    from dressage.tq.client import renewal as renewal_module

    monkeypatch.setattr(renewal_module, "RETENTION_RETRY_S", (0.01, 0.02))
    client = _Client(retention_s=0.1 * RENEW_SHARE, unanswered=3)  # e.g. a Proxy restarted beside a restarting TQ
    renewal = KeyRenewal(client, lambda: ["k"])
    renewal.start()
    try:
        renewal.hand_off(["handed"])
        eventually(lambda: client.rounds_with("k") >= 2 and client.rounds_with("handed") == 1)
        assert renewal.failures == 3 and renewal.period_s == pytest.approx(0.1)
    finally:
        renewal.close()


def test_a_round_whose_held_keys_cannot_be_listed_is_counted_and_the_next_one_renews():
    client = _Client(retention_s=0.05 * RENEW_SHARE)
    calls = []

    def held():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("dictionary changed size during iteration")
        return ["k"]

    renewal = KeyRenewal(client, held)
    renewal.start()
    try:
        eventually(lambda: client.rounds_with("k") >= 1)
        assert renewal.failures == 1 and renewal._thread.is_alive()
    finally:
        renewal.close()


def test_a_held_key_outlives_retention_and_a_key_nobody_holds_expires():
    with TransferQueue.start({"deployment": "embedded", "retention_s": 2.0}) as tq:
        client = tq.client()
        held = client.put("logprobs", np.arange(3, dtype=np.float32))
        stray = client.put("logprobs", np.zeros(3, np.float32))
        renewal = KeyRenewal(client, lambda: [held.key])
        renewal.start()
        try:
            time.sleep(4.5)  # 2.25 x retention_s (renewed every 0.5 s), nobody reading either key
            assert tq.controller.state(stray.key) is KeyState.CLEARED
            np.testing.assert_array_equal(client.get(held), np.arange(3, dtype=np.float32))
        finally:
            renewal.close()
        eventually(lambda: tq.total_keys() == 0)  # its holder stopped renewing: retention takes it
