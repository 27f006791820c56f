"""TransferQueue retention is a safety net for keys nobody will read: a session the Proxy holds keeps its keys
however long it lives or waits for its reader, and a key nobody holds still expires. Times scaled down:
retention 2 s (renewed every 0.5 s: a renewal may be late by 1.5 s on a loaded machine), a session alive
for 4.5 s and then finalized and unread for 2.5 s."""

from __future__ import annotations

import time

import numpy as np

from dressage.tq import TransferQueue
from dressage.tq.directory.entries import KeyState
from dressage.train.remote import ProxyTrajectorySource, consume
from clocks import eventually
from group_sessions import finalize_session, record_session


def test_a_session_the_proxy_holds_outlives_retention_and_a_key_nobody_holds_expires(engine, proxy_stack):
    tq = TransferQueue.start({"deployment": "embedded", "retention_s": 2.0})
    try:
        proxy = proxy_stack(engine.url, tq=tq, routed_experts_dtype="uint8")
        stray = tq.client().put("logprobs", np.zeros(3, np.float32))  # no session names it
        record_session(proxy.url, "long", "0", finalize=False)  # its step's keys written now, then untouched

        def held_keys():
            return sorted(k for k in tq.controller.keys() if k != stray.key)

        eventually(lambda: len(held_keys()) == 2)  # the call was answered; its TQ write lands behind it
        held = held_keys()
        assert all(k.startswith("long/") for k in held)
        time.sleep(4.5)  # the agent thinks, runs a tool: 2.25 x retention_s
        assert tq.controller.state(stray.key) is KeyState.CLEARED
        assert sorted(tq.controller.where(held)) == held
        finalize_session(proxy.url, "long", "0")
        time.sleep(2.5)  # finalized, waiting for its reader
        assert sorted(tq.controller.where(held)) == held
        source = ProxyTrajectorySource(proxy.url)
        report = consume(source, on_lost="fail")  # restores every large field, then acks and releases
        source.close()
        assert (report["sessions"], report["acknowledged"], report["tq_keys_read"]) == (1, 1, 2)
        assert report["tq_keys_left"] == 0 and tq.total_keys() == 0
        assert proxy.core.sessions == {}
    finally:
        tq.shutdown()
