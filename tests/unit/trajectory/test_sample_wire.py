"""Samples survive the JSON wire form exactly: refs stay refs, resident fields keep their bytes."""

import json

import numpy as np
import pytest

from dressage.errors import SampleWireError
from dressage.fields import ModelSpec
from dressage.proxy.config import DataPlaneConfig
from dressage.proxy.recording.core import ProxyCore
from dressage.rollout import RolloutManager
from dressage.rollout.manager import sample_ref_keys
from dressage.trajectory.sample_wire import sample_from_wire, sample_to_wire
from dressage.train import TrainingReader, samples_digest
from dressage.tq import TransferQueue

MODEL = ModelSpec(name="toy", num_layers=3, topk=2, num_experts=16)


def _samples(client, *, tq: bool):
    cfg = DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=tq,
                          routed_experts_dtype="uint8")
    manager = RolloutManager(dp_size=1)
    proxy = ProxyCore(cfg, client if tq else None, sink=manager)
    rng = np.random.default_rng(7)
    for g in range(2):
        s = proxy.create_session({"group_index": g})
        prompt = np.arange(1, 6, dtype=np.int32)
        for turn in range(2):
            d = proxy.plan(s.session_id, prompt)
            resp = rng.integers(10, 50, size=3).astype(np.int32)
            rows = len(prompt) + len(resp) - 1 - d.routed_experts_start
            proxy.begin_step(s.session_id, d, prompt_ids=prompt, response_ids=resp,
                             logprobs=-rng.random(3).astype(np.float32),
                             routed_experts=rng.integers(0, 16, size=(rows, 3, 2)).astype(np.int32)).result()
            prompt = np.concatenate([prompt, resp, np.array([2, 3], dtype=np.int32)])
        proxy.finalize(s.session_id, reward=float(g))
    return manager.take_batch(0).samples


def test_wire_round_trip_with_refs_restores_identical_fields():
    with TransferQueue.start({"deployment": "embedded"}) as tq:
        client = tq.client()
        direct = _samples(client, tq=True)
        wired = [sample_from_wire(json.loads(json.dumps(sample_to_wire(s)))) for s in direct]
        assert all(s.remote for s in wired)  # still references, nothing was read
        assert sample_ref_keys(wired) == sample_ref_keys(direct)
        TrainingReader(client).restore(direct)
        TrainingReader(client).restore(wired)
        baseline = _samples(None, tq=False)
        assert samples_digest(wired) == samples_digest(direct) == samples_digest(baseline)
        for a, b in zip(direct, wired):
            for name, arr in a.field_arrays().items():
                other = b.field_arrays()[name]
                assert arr.dtype == other.dtype and np.array_equal(arr, other), name


def test_wire_round_trip_of_resident_samples_keeps_bytes():
    samples = _samples(None, tq=False)
    back = [sample_from_wire(json.loads(json.dumps(sample_to_wire(s)))) for s in samples]
    assert samples_digest(back) == samples_digest(samples)
    assert back[0].rollout_routed_experts.dtype == np.int32


@pytest.mark.parametrize("mutate, needle", [
    (lambda w: w.update(v=2), "wire form"),
    (lambda w: w.update(extra=1), "unknown keys"),
    (lambda w: w.update(response_length=10**6), "response_length"),
    (lambda w: w["loss_mask"].append(1), "response_length"),
    (lambda w: w.update(tokens=[1, "a"]), "integers"),
    (lambda w: w.update(tokens=[2**40]), "outside int32"),
    (lambda w: w.update(reward=float("nan")), "finite"),
    (lambda w: w["rollout_log_probs"].update(b64="!!"), "base64"),
    (lambda w: w["rollout_log_probs"].update(shape=[999]), "bytes"),
    (lambda w: w["rollout_routed_experts"].update(dtype="object"), "dtype"),
])
def test_malformed_wire_form_is_a_typed_error(mutate, needle):
    wire = json.loads(json.dumps(sample_to_wire(_samples(None, tq=False)[0])))
    mutate(wire)
    with pytest.raises(SampleWireError, match=needle):
        sample_from_wire(wire)


def test_malformed_ref_piece_is_a_typed_error():
    with TransferQueue.start({"deployment": "embedded"}) as tq:
        wire = sample_to_wire(_samples(tq.client(), tq=True)[0])
        piece = wire["remote"]["routed_experts"][0]
        piece["stop"] = 10**6
        with pytest.raises(SampleWireError, match="outside"):
            sample_from_wire(wire)
        piece["ref"] = ["nope"]
        with pytest.raises(SampleWireError):
            sample_from_wire(wire)


def test_binary_wire_form_through_msgpack_keeps_bytes_and_skips_base64():
    import msgpack

    samples = _samples(None, tq=False)
    packed = [msgpack.packb(sample_to_wire(s, binary=True), use_bin_type=True) for s in samples]
    wire = msgpack.unpackb(packed[0], raw=False)
    assert isinstance(wire["rollout_routed_experts"]["data"], bytes) and "b64" not in wire["rollout_routed_experts"]
    back = [sample_from_wire(msgpack.unpackb(p, raw=False)) for p in packed]
    assert samples_digest(back) == samples_digest(samples)
    # a third smaller than the JSON form: the arrays' bytes travel as they are
    assert sum(map(len, packed)) < sum(len(json.dumps(sample_to_wire(s))) for s in samples)


@pytest.mark.parametrize("mutate, needle", [
    (lambda a: a.update(data="not bytes"), "must be bytes"),
    (lambda a: a.update(data=b"\0" * 3), "bytes for"),
    (lambda a: a.update(b64="AAAA"), "b64|data"),
])
def test_malformed_binary_array_is_a_typed_error(mutate, needle):
    import msgpack

    wire = msgpack.unpackb(msgpack.packb(sample_to_wire(_samples(None, tq=False)[0], binary=True),
                                         use_bin_type=True), raw=False)
    mutate(wire["rollout_log_probs"])
    with pytest.raises(SampleWireError, match=needle):
        sample_from_wire(wire)


def test_binary_arrays_are_read_only_views_of_the_received_bytes():
    import msgpack

    wire = msgpack.unpackb(msgpack.packb(sample_to_wire(_samples(None, tq=False)[0], binary=True),
                                         use_bin_type=True), raw=False)
    raw = wire["rollout_routed_experts"]["data"]
    back = sample_from_wire(wire)
    r3 = back.rollout_routed_experts
    assert not r3.flags.writeable and np.shares_memory(r3, np.frombuffer(raw, np.uint8))
