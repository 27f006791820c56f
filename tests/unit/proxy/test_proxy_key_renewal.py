"""The Proxy keeps the TQ keys of every session it holds (live, or finalized and not yet acknowledged) out of
the retention sweep, and hands a forgotten session's keys on with a whole ``retention_s`` to restore them."""

import numpy as np

from dressage.dataplane import DataPlaneConfig
from dressage.fields import ModelSpec
from dressage.proxy.recording.core import ProxyCore
from dressage.rollout import RolloutManager
from dressage.tq import TransferQueueClient
from dressage.tq.directory.controller import Controller
from dressage.tq.directory.entries import KeyState, UnitInfo
from dressage.tq.storage.memory import MemoryStorageUnit
from clocks import FakeClock, eventually

MODEL = ModelSpec(name="toy", num_layers=4, topk=2, num_experts=16)



def _core(client, sink=None):
    cfg = DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=True,
                          routed_experts_dtype="uint8")
    return ProxyCore(cfg, client, sink=sink)


def _session(core, prompt):
    sid = core.create_session({"group_index": 0}).session_id
    prompt = np.asarray(prompt, np.int32)
    d = core.plan(sid, prompt)
    rows = len(prompt) + 2 - 1 - d.routed_experts_start
    core.begin_step(sid, d, prompt_ids=prompt, response_ids=[7, 8], logprobs=[-0.5, -0.25],
                    routed_experts=np.ones((rows, 4, 2), np.int32)).result()
    return sid


def test_held_sessions_are_renewed_and_a_forgotten_one_gets_retention_s_from_its_hand_off():
    clock = FakeClock()
    ctl = Controller([UnitInfo("u0")], retention_s=100.0, clock=clock)
    client = TransferQueueClient(ctl, {"u0": MemoryStorageUnit("u0")})
    core = _core(client, sink=RolloutManager())
    try:
        acked, live = _session(core, [1, 2, 3]), _session(core, [4, 5, 6])
        core.finalize(acked, reward=1.0)
        stray = client.put("logprobs", np.zeros(2, np.float32))  # a key no session names
        keys = {sid: sorted(k for k in core.held_keys() if k.startswith(sid)) for sid in (acked, live)}
        assert [len(k) for k in keys.values()] == [2, 2]
        eventually(lambda: core.renewal.rounds >= 1)  # the first round ran as the first step was written
        clock.now = 90.0
        assert core.renewal.renew() == 4  # what the renewal thread does every retention_s / 4
        clock.now = 95.0
        renewed = core.renewal.renewed
        core.forget(acked)  # the trainer acknowledged it: the keys leave the Proxy ...
        eventually(lambda: core.renewal.renewed == renewed + 2)  # ... renewed once more as they go
        assert sorted(core.held_keys()) == keys[live]
        clock.now = 150.0
        assert ctl.expire() == {"u0": [stray.key]}  # untouched since t=0: nobody holds it
        clock.now = 180.0
        assert core.renewal.renew() == 2  # the next round: only the session still held
        clock.now = 194.0
        assert ctl.expire() == {}  # the acknowledged keys' retention counts from the hand-off at t=95
        clock.now = 195.5
        assert sorted(ctl.expire()["u0"]) == keys[acked]  # nobody renews them after the hand-off
        assert ctl.state(keys[acked][0]) is KeyState.CLEARED and sorted(ctl.keys()) == keys[live]
    finally:
        core.close()
    assert not core.renewal._thread.is_alive()


def test_a_core_without_offloaded_writes_starts_no_renewal(tq):
    core = ProxyCore(DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=True),
                     tq.client())
    core.create_session()
    assert core.renewal is not None and core.renewal._thread is None
    core.close()
