"""A drained session id used again starts a new session: it gets its own finalize answer and its own
TransferQueue keys, while the reader of its first life may still hold that life's keys; both lives restore
whole and leave no key once each reader released its own."""

from __future__ import annotations

import httpx
import numpy as np

from dressage.rollout.manager import sample_ref_keys
from dressage.train import TrainingReader, release_batch
from dressage.trajectory.sample_wire import sample_from_wire

ENGINE = {"seed": 5, "mean_response_tokens": 8, "tool_call_rate": 0.0}


def _call(url: str, sid: str, text: str) -> list[float]:
    """One recorded call of header session ``sid``; the logprobs of its reply."""
    r = httpx.post(url + "/v1/chat/completions", headers={"X-Session-Id": sid}, timeout=30,
                   json={"messages": [{"role": "user", "content": text}], "max_tokens": 6, "logprobs": True})
    assert r.status_code == 200, r.text
    return [t["logprob"] for t in r.json()["choices"][0]["logprobs"]["content"]]


def _finalize(url: str, sid: str, reward: float) -> dict:
    r = httpx.post(url + "/session/finalize", json={"session_id": sid, "reward": reward}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _read_and_ack(url: str, sid: str) -> list:
    """A leased read of ``sid``'s Samples, acknowledged: the id is drained; the reader holds the keys."""
    read = httpx.post(url + "/trajectory/read", json={"session_ids": [sid], "format": "samples", "lease": True},
                      timeout=30).json()
    ack = httpx.post(url + "/trajectory/ack", json={"read_id": read["read_id"]}, timeout=30).json()
    assert ack["acknowledged_session_ids"] == [sid]
    return [sample_from_wire(s) for t in read["data"] for s in t["samples"]]


def test_a_session_id_used_again_gets_the_finalize_answer_of_its_new_life(engine, tq, proxy_stack):
    proxy = proxy_stack(engine.url, tq=tq, routed_experts_dtype="uint8")
    _call(proxy.url, "A", "first life")
    first = _finalize(proxy.url, "A", 1.0)
    release_batch(tq.client(), sample_ref_keys(_read_and_ack(proxy.url, "A")))
    _call(proxy.url, "A", "second life " * 10)
    _call(proxy.url, "A", "second life, another call")
    second = _finalize(proxy.url, "A", 0.0)
    assert (first["reward"], first["num_steps"]) == (1.0, 1)
    assert (second["reward"], second["num_steps"]) == (0.0, 2) and second["finalization_id"] != first["finalization_id"]
    assert proxy.service.core.session("A").state == "finalized"
    assert _finalize(proxy.url, "A", 0.5) == second  # a repeat answers the new life's finalize
    samples = _read_and_ack(proxy.url, "A")
    assert [s.reward for s in samples] == [0.0] * len(samples) and samples
    assert release_batch(tq.client(), sample_ref_keys(samples)) == 4 and tq.total_keys() == 0


def test_a_session_id_used_again_writes_keys_of_its_own_while_the_first_reader_holds_its(engine, tq,
                                                                                         proxy_stack):
    proxy = proxy_stack(engine.url, tq=tq, routed_experts_dtype="uint8")
    logprobs = {"first": _call(proxy.url, "B", "first life")}
    _finalize(proxy.url, "B", 1.0)
    lives = {"first": _read_and_ack(proxy.url, "B")}  # its reader restores and releases later, at its step
    logprobs["second"] = _call(proxy.url, "B", "second life " * 10)
    _finalize(proxy.url, "B", 0.0)
    lives["second"] = _read_and_ack(proxy.url, "B")
    keys = {life: sample_ref_keys(samples) for life, samples in lives.items()}
    assert len(keys["first"]) == len(keys["second"]) == 2 and not keys["first"] & keys["second"]
    assert tq.total_keys() == 4
    client = tq.client()
    for life, samples in lives.items():
        (restored,) = TrainingReader(client).restore(samples)
        response = restored.tokens[-restored.response_length:]
        assert restored.reward == (1.0 if life == "first" else 0.0)
        np.testing.assert_allclose(restored.rollout_log_probs, np.asarray(logprobs[life], np.float32))
        assert restored.rollout_routed_experts.shape[0] == len(restored.tokens) - 1 and len(response) > 0
    assert release_batch(client, keys["first"]) == 2 and tq.total_keys() == 2
    assert release_batch(client, keys["second"]) == 2 and tq.total_keys() == 0
