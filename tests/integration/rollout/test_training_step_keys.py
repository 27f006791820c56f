"""A training step releases its batch's TransferQueue keys also when a rank fails: the batch left the
RolloutManager when it was cut, so nobody else would ever release them (the Ray backend and the
in-process one of ``dressage run``)."""

from __future__ import annotations

import numpy as np
import pytest

from dressage.dataplane import DataPlaneConfig
from dressage.errors import LostSamplesError, StorageUnitUnavailable
from dressage.fields import ModelSpec
from dressage.harness.run import RunConfig
from dressage.harness.run.config import RolloutConfig
from dressage.harness.run.loop import _LocalBackend
from dressage.proxy.recording.core import ProxyCore
from dressage.tq import TransferQueue

MODEL = ModelSpec(name="toy", num_layers=4, topk=2, num_experts=16)
CONFIG = DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=True,
                         routed_experts_dtype="uint8")


def _two_sessions_one_key_lost(client, sink) -> ProxyCore:
    """Two finalized sessions in two prompt groups (one per DP rank); one key of the first is deleted."""
    core = ProxyCore(CONFIG, client, sink=sink)
    for group in range(2):
        session = core.create_session({"group_index": group})
        prompt = np.array([1, 2, 3], dtype=np.int32)
        decision = core.plan(session.session_id, prompt)
        rows = len(prompt) + 2 - 1 - decision.routed_experts_start
        core.begin_step(session.session_id, decision, prompt_ids=prompt, response_ids=[7, 8],
                        logprobs=[-0.5, -0.25], routed_experts=np.ones((rows, 4, 2), np.int32)).result()
        core.finalize(session.session_id, reward=1.0)
    first = next(iter(core.sessions.values()))
    client.delete([first.large_field_refs()[0].key])  # that session's rank meets a lost key
    return core


def test_a_failed_in_process_step_still_releases_the_batch_keys(tq):
    client = tq.client()
    backend = _LocalBackend(RunConfig(data_plane=CONFIG, rollout=RolloutConfig(dp_size=2)), client)
    _two_sessions_one_key_lost(client, backend.sink)
    assert tq.total_keys() == 3  # logprobs and routed_experts of each session's step, one lost
    with pytest.raises(LostSamplesError):
        backend.train(0)
    assert tq.total_keys() == 0 and backend.rm.num_ready == 0


def test_a_release_that_fails_after_a_failed_step_does_not_hide_the_steps_error(tq, monkeypatch, caplog):
    """The restore's LostSamplesError names the lost Samples; a release failing after it (a unit that
    does not answer, say) is logged, and the step's error is what the caller sees."""
    client = tq.client()
    backend = _LocalBackend(RunConfig(data_plane=CONFIG, rollout=RolloutConfig(dp_size=2)), client)
    _two_sessions_one_key_lost(client, backend.sink)
    real_delete, released = client.delete, []

    def delete(keys):
        released.append(real_delete(keys))
        raise StorageUnitUnavailable("StorageUnit u9 is unavailable (delete: no reply within 2 s)")

    monkeypatch.setattr(client, "delete", delete)
    with pytest.raises(LostSamplesError) as info:
        backend.train(0)
    assert len(info.value.samples) == 1 and released == [3]    # the release was still made, once
    assert tq.total_keys() == 0 and "u9" in caplog.text


@pytest.mark.ray
def test_a_rank_that_fails_its_restore_still_has_the_batch_keys_released():
    import ray

    from dressage.train.ray_actors import RayBackend, RayBackendConfig

    # A TransferQueue of processes: the trainer actors reach its StorageUnits from theirs.
    with TransferQueue.start({"deployment": "local", "num_storage_units": 1, "retention_s": None}) as tq:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        backend = None
        try:
            client = tq.client()
            backend = RayBackend(RayBackendConfig(model=MODEL, dp_size=2), tq.client_spec(), client)
            _two_sessions_one_key_lost(client, backend.sink)
            assert tq.total_keys() == 3
            with pytest.raises(LostSamplesError) as info:   # the rank's own error, naming the lost Sample
                backend.train(0)
            assert len(info.value.samples) == 1 and isinstance(info.value.__cause__, ray.exceptions.RayTaskError)
            assert tq.total_keys() == 0  # the other rank trained; the batch's keys went with the step
        finally:
            if backend is not None:
                backend.close()
            ray.shutdown()
