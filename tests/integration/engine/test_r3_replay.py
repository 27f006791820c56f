"""R3 end to end on a real MoE model: engine (transformers backend) -> Proxy -> TQ -> trainer replay.

The engine runs a seeded random-weight Qwen3MoeForCausalLM on CPU with the real Qwen3 tokenizer;
the trainer rebuilds the same model, forces routing to the restored ``rollout_routed_experts`` and
must reproduce ``rollout_log_probs`` bit for bit.
"""

import asyncio

import httpx
import openai
import pytest

pytest.importorskip("torch", reason="the transformers backend needs torch (the hf extra)")
pytest.importorskip("transformers", reason="the transformers backend needs transformers (the hf extra)")

from dressage.engine.hf_backend import TransformersEngine  # noqa: E402
from dressage.engine.moe import build_moe_model  # noqa: E402
from dressage.errors import FieldShapeError  # noqa: E402
from dressage.fields import get_model  # noqa: E402
from dressage.fields.r3 import R3_DTYPES  # noqa: E402
from dressage.harness.replay import replay_sample  # noqa: E402
from dressage.testing.stack import start_engine, start_proxy  # noqa: E402
from dressage.tq import TransferQueue  # noqa: E402
from dressage.train import check_sample  # noqa: E402

MODEL = get_model("tiny-qwen3-moe")
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "evaluate an expression",
                                            "parameters": {"type": "object",
                                                           "properties": {"expr": {"type": "string"}}}}}]
SEED = 5


@pytest.fixture(scope="module")
def engine(qwen3):
    """The transformers backend (a real MoE model) on the real Qwen3 tokenizer, not the built-in engine."""
    srv = start_engine(model=MODEL, backend="transformers", seed=SEED, tokenizer="qwen3", tool_call_rate=0.6,
                       mean_response_tokens=16, make_engine=lambda config: TransformersEngine(config, qwen3))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def trainer_model(engine):
    return build_moe_model("tiny-qwen3-moe", vocab_size=engine.engine.moe.vocab_size, seed=SEED)


def _proxy(engine, qwen3, tq, dtype):
    """The Proxy of these tests: R3 as ``dtype``, the engine's Qwen3 tokenizer, one DP rank."""
    stack = start_proxy(engine.url, model=MODEL, tq=tq, routed_experts_dtype=dtype, tokenizer=qwen3,
                        tokenizer_name="qwen3", request_timeout_s=60, dp_size=1)
    return stack, stack.manager


async def _conversation(url, turns=3):
    async with httpx.AsyncClient() as h:
        r = (await h.post(url + "/sessions", json={"metadata": {"group_index": 0, "sample_index": 0}})).json()
        client = openai.AsyncOpenAI(base_url=r["base_url"], api_key="none")
        msgs = [{"role": "user", "content": "What is 6*7? Use the calculator."}]
        for _ in range(turns):
            resp = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, max_tokens=40)
            msg = resp.choices[0].message.model_dump(exclude_none=True)
            msg.pop("reasoning_content", None)
            msgs.append(msg)
            if msg.get("tool_calls"):
                msgs += [{"role": "tool", "tool_call_id": c["id"], "content": "42"} for c in msg["tool_calls"]]
            else:
                msgs.append({"role": "user", "content": "Once more."})
        await client.close()
        await h.post(f"{url}/sessions/{r['session_id']}/finalize", json={"reward": 1.0})


@pytest.mark.parametrize("tq_on", [False, True], ids=["tq_off", "tq_on"])
@pytest.mark.parametrize("dtype", sorted(R3_DTYPES))
def test_forced_routing_reproduces_rollout_logprobs(engine, qwen3, trainer_model, restore_batch, tq_on, dtype):
    tq = TransferQueue.start({"deployment": "embedded"}) if tq_on else None
    server, rm = _proxy(engine, qwen3, tq, dtype)
    try:
        asyncio.run(_conversation(server.url))
        (sample,) = restore_batch(rm, tq)
        check_sample(sample, num_layers=MODEL.num_layers, topk=MODEL.topk, num_experts=MODEL.num_experts)
        assert sample.metadata["boundary_reason"] == "new_session" and len(sample.metadata["step_ids"]) == 3
        assert qwen3.decode(sample.tokens.tolist()).count("<think>") == 3
        result = replay_sample(trainer_model, sample)
        assert result.tokens > 30
        assert result.bit_identical, result.to_dict()
        assert result.max_abs_diff == 0.0 and result.sum_abs_diff <= 1e-6
        assert result.expert_mismatch == 0.0
        if tq is not None:
            assert tq.total_keys() == 0
    finally:
        server.close()
        if tq is not None:
            tq.shutdown()


def test_without_replay_perturbed_weights_change_the_experts(engine, qwen3, trainer_model, restore_batch):
    server, rm = _proxy(engine, qwen3, None, "uint8")
    try:
        asyncio.run(_conversation(server.url, turns=2))
        (sample,) = restore_batch(rm, None)
    finally:
        server.close()
    same = replay_sample(trainer_model, sample, force=False)
    assert same.expert_mismatch == 0.0 and same.bit_identical       # same weights: the same routing anyway
    moved = trainer_model.perturbed(1e-3)
    free = replay_sample(moved, sample, force=False)
    forced = replay_sample(moved, sample, force=True)
    assert free.expert_mismatch > 0.0                                # the trainer would route elsewhere
    assert forced.expert_mismatch == 0.0                             # replay keeps the rollout's experts
    assert not free.bit_identical and not forced.bit_identical       # and the weights did change
    # Off-by-one rows are caught: shifted experts do not reproduce the logprobs.
    shifted = sample.rollout_routed_experts.copy()
    shifted[1:] = sample.rollout_routed_experts[:-1]
    sample.rollout_routed_experts = shifted
    assert not replay_sample(trainer_model, sample).bit_identical
    with pytest.raises(FieldShapeError):
        trainer_model.score(sample.tokens, sample.prompt_length, routed_experts=shifted[:-1])
