"""Faults on real unit processes: a killed unit is dead within a bound, a stopped one by time-out and
live again once resumed; new puts go to live units, reads of lost keys fail fast, the reader drops
exactly the affected Samples."""

from __future__ import annotations

import time

import numpy as np
import pytest

from dressage.errors import StorageUnitUnavailable
from dressage.testing import kill_unit, stopped_unit, wait_unit_state
from dressage.train import TrainingReader
from dressage.trajectory import Piece, Sample
from dressage.tq import TransferQueue

T, R, L, K = 48, 12, 2, 4
FAST = {"deployment": "local", "num_storage_units": 2, "unit_memory_budget": "4MiB", "request_timeout_s": 20,
        "heartbeat_interval_s": 0.2, "unit_dead_after_s": 1.0, "retention_s": None}


def _sample(client, i: int) -> Sample:
    lp = np.full(R, i, dtype=np.float32)
    r3 = np.full((T - 1, L, K), i % 250, dtype=np.uint8)
    lp_ref, r3_ref = client.put_many([("logprobs", lp), ("routed_experts", r3)], batch="rollout-0")
    s = Sample(tokens=np.arange(T, dtype=np.int32), response_length=R, loss_mask=np.ones(R, dtype=np.int32),
               token_versions=np.zeros(R, dtype=np.int32), session_id=f"sess{i}", group_index=i,
               r3_trailing=(L, K))
    s.remote = {"logprobs": (Piece(lp_ref, 0, R),), "routed_experts": (Piece(r3_ref, 0, T - 1),)}
    return s


def _unit_of(s: Sample) -> str:
    return s.remote["logprobs"][0].value.unit_id


def test_killed_unit_is_dead_at_once_and_the_reader_drops_exactly_its_samples():
    with TransferQueue.start({**FAST, "unit_dead_after_s": 5.0}) as tq:
        client = tq.client()
        samples = [_sample(client, i) for i in range(8)]
        victim = _unit_of(samples[0])
        hit = [s for s in samples if _unit_of(s) == victim]
        assert 0 < len(hit) < len(samples)
        kill_unit(tq, victim)
        wait_unit_state(tq, victim, "dead", 5.0)
        # Marked by the watch on its process, not by the 5 s probe time-out.
        assert tq.unit_states()[victim]["reason"].startswith(f"process {tq.processes()[victim]} exited")
        later = [_sample(client, 100 + i) for i in range(4)]
        assert {_unit_of(s) for s in later} != {victim} and all(_unit_of(s) != victim for s in later)
        lost_keys = [s.remote["logprobs"][0].value.key for s in hit]
        with pytest.raises(StorageUnitUnavailable) as info:
            client.get_many([s.remote["logprobs"][0].value for s in hit])
        assert "no reply within" not in str(info.value)  # failed on the known death, not by a time-out
        assert victim in str(info.value) and lost_keys[0] in str(info.value) and "exited" in str(info.value)
        reader = TrainingReader(client, on_lost="drop")
        kept = reader.restore(samples)
        assert {s.session_id for s in kept} == {s.session_id for s in samples} - {s.session_id for s in hit}
        assert {s.session_id for s in reader.last_lost.samples} == {s.session_id for s in hit}
        for s in kept:
            i = int(s.session_id[4:])
            assert s.rollout_log_probs.tolist() == [float(i)] * R
            assert s.rollout_routed_experts.dtype == np.int32 and int(s.rollout_routed_experts[0, 0, 0]) == i
        assert tq.stats()[victim]["state"] == "dead"
        assert client.clear("rollout-0") == 2 * (len(samples) + len(later))  # the dead unit is skipped


def test_stopped_unit_is_dead_by_timeout_and_live_again_after_sigcont():
    with TransferQueue.start(FAST) as tq:
        client = tq.client()
        samples = [_sample(client, i) for i in range(6)]
        victim = _unit_of(samples[0])
        refs = [s.remote["routed_experts"][0].value for s in samples if _unit_of(s) == victim]
        with stopped_unit(tq, victim):
            assert tq.unit_states()[victim]["state"] == "live"   # stopped is not dead before it misses probes
            wait_unit_state(tq, victim, "dead", 5.0)
            assert tq.unit_states()[victim]["reason"].startswith("answered no probe")  # by time-out: no exit
            with pytest.raises(StorageUnitUnavailable, match="answered no probe") as info:
                client.get_many(refs)
            assert "marked dead by the Controller" in str(info.value)  # refused at once, as known dead
            during = [_sample(client, 50 + i) for i in range(3)]
            assert all(_unit_of(s) != victim for s in during)
        wait_unit_state(tq, victim, "live", 3.0)
        deadline = time.monotonic() + 1.0              # the client's copy of the states is <= 0.2 s old
        while victim in client.dead_units() and time.monotonic() < deadline:
            time.sleep(0.02)
        got = client.get_many(refs)                    # nothing was lost while it was stopped
        assert [int(g[0, 0, 0]) for g in got] == [int(s.session_id[4:]) for s in samples if _unit_of(s) == victim]
        assert tq.stats()[victim]["available"] is True
        assert client.clear("rollout-0") == 2 * 9 and tq.total_keys() == 0
