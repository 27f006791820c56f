"""The transformers engine backend without HTTP: real router ids, start offsets, reasoning, tools."""

import numpy as np
import pytest

pytest.importorskip("torch", reason="the transformers backend needs torch (the hf extra)")
pytest.importorskip("transformers", reason="the transformers backend needs transformers (the hf extra)")

from dressage.engine.config import EngineConfig  # noqa: E402
from dressage.engine.hf_backend import TransformersEngine, make_engine  # noqa: E402
from dressage.engine.moe import build_moe_model  # noqa: E402
from dressage.errors import ConfigError, FieldShapeError, TokenizerError  # noqa: E402
from dressage.fields import get_model  # noqa: E402
from dressage.fields.sglang import decode_routed_experts_b64  # noqa: E402
from dressage.proxy.openai.chat.prompt import QwenToolCallParser  # noqa: E402
from dressage.tokenizer import load_tokenizer  # noqa: E402

MODEL = get_model("tiny-qwen3-moe")
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "evaluate",
                                            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def hf_engine():
    try:
        tok = load_tokenizer("qwen3")
    except TokenizerError as exc:
        pytest.skip(f"real Qwen3 tokenizer unavailable: {exc}")
    return TransformersEngine(EngineConfig(model=MODEL, backend="transformers", seed=2, tokenizer="qwen3",
                                           tool_call_rate=1.0, mean_response_tokens=12), tok)


def _answer(hf_engine, prompt, start=0, n=None):
    (req,), _ = hf_engine.parse({"input_ids": prompt, "return_logprob": True, "return_routed_experts": True,
                              "routed_experts_start_len": start, "sampling_params": {"max_new_tokens": 48}})
    gen = hf_engine.start(req)
    return gen, hf_engine.finish(gen, gen.num_tokens if n is None else n)


def test_answer_has_real_router_rows_honouring_the_start(hf_engine):
    tok = hf_engine.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "6*7?"}], TOOLS, True)
    gen, out = _answer(hf_engine, prompt)
    n, p = len(out["output_ids"]), len(prompt)
    rows = decode_routed_experts_b64(out["meta_info"]["routed_experts"], MODEL.num_layers, MODEL.topk)
    assert rows.shape == (p + n - 1, MODEL.num_layers, MODEL.topk)
    # The rows and logprobs are the model's: a fresh forward pass of the same seed gives them back.
    twin = build_moe_model(MODEL.name, vocab_size=hf_engine.moe.vocab_size, seed=2)
    scores = twin.score(np.array(prompt + out["output_ids"]), p)
    np.testing.assert_array_equal(rows, scores.routed_experts)
    lps = np.array([e[0] for e in out["meta_info"]["output_token_logprobs"]], np.float32)
    np.testing.assert_array_equal(lps, scores.logprobs.astype(np.float32))
    assert np.all(np.diff(np.sort(rows, axis=-1), axis=-1) > 0)   # top-k ids distinct per row
    # routed_experts_start_len cuts the head; an aborted answer keeps a prefix of the same rows.
    _, late = _answer(hf_engine, prompt, start=p - 5)
    np.testing.assert_array_equal(
        decode_routed_experts_b64(late["meta_info"]["routed_experts"], MODEL.num_layers, MODEL.topk), rows[p - 5:])
    cut = hf_engine.finish(gen, 3, aborted=True)
    np.testing.assert_array_equal(
        decode_routed_experts_b64(cut["meta_info"]["routed_experts"], MODEL.num_layers, MODEL.topk), rows[:p + 2])


def test_reply_thinks_and_calls_the_offered_tool(hf_engine):
    tok = hf_engine.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "6*7?"}], TOOLS, True)
    _, out = _answer(hf_engine, prompt)
    content, reasoning, calls = QwenToolCallParser().parse(tok.decode(out["output_ids"]), call_id_prefix="c")
    assert reasoning and calls and calls[0]["function"]["name"] == "calculator"
    # With thinking turned off by the template (an empty think block in the prompt), no reasoning.
    off = tok.hf_tokenizer.apply_chat_template([{"role": "user", "content": "6*7?"}], tools=TOOLS,
                                               add_generation_prompt=True, enable_thinking=False, tokenize=False)
    _, out = _answer(hf_engine, tok.encode(off))
    assert "<think>" not in tok.decode(out["output_ids"])


def test_model_info_and_bad_inputs(hf_engine):
    info = hf_engine.model_info()
    assert (info["num_hidden_layers"], info["num_experts_per_tok"], info["num_experts"]) == (2, 2, 8)
    with pytest.raises(ConfigError):
        EngineConfig(backend="vllm")
    with pytest.raises(ConfigError):   # the preset must describe the model's real shape
        make_engine(EngineConfig(model=get_model("tiny-moe"), backend="transformers"), hf_engine.tokenizer)
    with pytest.raises(FieldShapeError):
        hf_engine.moe.score(np.array([1, 2, 3]), 1, routed_experts=np.full((2, 2, 2), 9))


def test_cli_backend_picks_the_real_model_and_tokenizer():
    from dressage.cli import build_parser
    from dressage.cli.engine import config_from_args

    real = config_from_args(build_parser().parse_args(["engine", "serve", "--backend", "transformers"]))
    assert (real.backend, real.model.name, real.tokenizer) == ("transformers", "tiny-qwen3-moe", "qwen3")
    plain = config_from_args(build_parser().parse_args(["engine", "serve"]))
    assert (plain.backend, plain.tokenizer) == ("builtin", "byte") and plain.model.name != "tiny-qwen3-moe"


def test_the_window_is_the_model_positions_and_a_longer_prompt_is_a_400_naming_it(hf_engine):
    from dressage.errors import EngineRequestError

    window = hf_engine.moe.model.config.max_position_embeddings
    assert hf_engine.config.context_length == window == 40960        # sized for 32K-token prompts
    (req,), _ = hf_engine.parse({"input_ids": [11] * (window + 5), "sampling_params": {"max_new_tokens": 4}})
    with pytest.raises(EngineRequestError) as err:
        hf_engine.start(req)
    assert err.value.status_code == 400 and f"({window} tokens)" in str(err.value)
    # a smaller window of the engine's own config is kept
    small = TransformersEngine(EngineConfig(model=MODEL, backend="transformers", seed=2, tokenizer="qwen3",
                                            context_length=1000), hf_engine.tokenizer, model=hf_engine.moe)
    assert small.config.context_length == 1000


def test_scoring_in_blocks_gives_each_row_the_value_of_one_pass(hf_engine):
    # A reply longer than a block of logit rows: the values are those of scoring each prefix alone.
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 150000, 1200)
    whole = hf_engine.moe.score(ids, 100)
    part = hf_engine.moe.score(ids[:700], 100)
    np.testing.assert_array_equal(whole.logprobs[:600].astype(np.float32), part.logprobs.astype(np.float32))
    np.testing.assert_array_equal(whole.routed_experts[:699], part.routed_experts)
