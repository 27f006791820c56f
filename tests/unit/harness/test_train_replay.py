"""``replay_summary`` / ``merge_replay``: the trainer's R3 check added up over Samples, with values.

Samples are scored by the real tiny Qwen3-MoE; their recorded logprobs are then edited at known
positions, so every count and difference the summary reports is known in advance.
"""

import numpy as np
import pytest

from dressage.errors import FieldShapeError
from dressage.harness.replay import merge_replay, replay_summary
from dressage.trajectory import Sample

ZERO = {"samples": 0, "tokens": 0, "identical_tokens": 0, "max_abs_diff": 0.0, "max_sum_abs_diff": 0.0}


def test_merge_replay_adds_counts_and_keeps_the_worst_differences():
    a = {"samples": 2, "tokens": 10, "identical_tokens": 9, "max_abs_diff": 0.5, "max_sum_abs_diff": 0.25}
    b = {"samples": 1, "tokens": 4, "identical_tokens": 4, "max_abs_diff": 0.0, "max_sum_abs_diff": 0.75}
    assert merge_replay(a, b) == {"samples": 3, "tokens": 14, "identical_tokens": 13, "max_abs_diff": 0.5,
                                  "max_sum_abs_diff": 0.75}
    assert merge_replay(b, a) == merge_replay(a, b)
    first = merge_replay({}, b)
    assert first == b and first is not b  # a copy: adding to it leaves b alone
    first["samples"] += 1
    assert b["samples"] == 1


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("torch", reason="the replay model needs torch (the hf extra)")
    pytest.importorskip("transformers", reason="the replay model needs transformers (the hf extra)")
    from dressage.engine.moe import build_moe_model

    return build_moe_model("tiny-qwen3-moe", vocab_size=300, seed=3)


PROMPT, RESPONSE = 5, 7
MASK = np.array([1, 1, 0, 1, 1, 0, 1], dtype=np.int32)  # 5 trained tokens


def _sample(model, seed, edit=None):
    """A Sample whose recorded fields are ``model``'s own scores, then ``edit(logprobs, experts)``."""
    tokens = np.random.default_rng(seed).integers(0, model.vocab_size, PROMPT + RESPONSE).astype(np.int32)
    scores = model.score(tokens, PROMPT)
    logprobs = scores.logprobs.astype(np.float32)
    experts = scores.routed_experts.copy()
    if edit is not None:
        edit(logprobs, experts)
    return Sample(tokens=tokens, response_length=RESPONSE, loss_mask=MASK.copy(),
                  token_versions=np.zeros(RESPONSE, np.int32), rollout_log_probs=logprobs,
                  rollout_routed_experts=experts, session_id=f"s{seed}")


def _shift(logprobs, experts):
    logprobs[0] += np.float32(0.5)   # trained: counted
    logprobs[2] -= np.float32(10.0)  # loss mask 0: not compared


def test_summary_of_faithful_and_edited_samples(model):
    faithful, edited = _sample(model, 1), _sample(model, 2, _shift)
    assert replay_summary(model, []) == ZERO
    assert replay_summary(model, [faithful]) == {"samples": 1, "tokens": 5, "identical_tokens": 5,
                                                 "max_abs_diff": 0.0, "max_sum_abs_diff": 0.0}
    one = replay_summary(model, [edited])
    assert (one["samples"], one["tokens"], one["identical_tokens"]) == (1, 5, 4)
    assert one["max_abs_diff"] == pytest.approx(0.5, abs=1e-6)
    assert one["max_sum_abs_diff"] == pytest.approx(0.5, abs=1e-6)
    both = replay_summary(model, [faithful, edited])
    assert (both["samples"], both["tokens"], both["identical_tokens"]) == (2, 10, 9)
    assert both == merge_replay(replay_summary(model, [faithful]), one)


def test_summary_forces_the_recorded_routing(model):
    """Other experts than the ones recorded change the trained tokens' logprobs: routing is forced."""
    def reroute(logprobs, experts):
        experts[:] = (experts + 1) % model.num_experts

    r = replay_summary(model, [_sample(model, 4, reroute)])
    assert r["tokens"] == 5 and r["identical_tokens"] < 5 and r["max_abs_diff"] > 1e-6


def test_summary_needs_restored_fields(model):
    s = _sample(model, 5)
    bare = Sample(tokens=s.tokens, response_length=RESPONSE, loss_mask=MASK, token_versions=s.token_versions,
                  session_id="bare")
    with pytest.raises(FieldShapeError, match="bare#0: logprobs and routed experts must be restored"):
        replay_summary(model, [s, bare])
