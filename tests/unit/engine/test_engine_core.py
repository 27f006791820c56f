"""The engine without HTTP: determinism, routing by prefix, stop handling, tool calls, validation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dressage.engine import Engine, EngineConfig, RoutingModel
from dressage.fields.config import model_from_preset
from dressage.errors import ConfigError, EngineRequestError
from dressage.fields.models import ModelSpec
from dressage.fields.sglang import decode_generate_response
from dressage.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
TINY = model_from_preset("tiny-moe")
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}}}]


def _engine(**kw) -> Engine:
    return Engine(EngineConfig(model=kw.pop("model", TINY), **kw))


def _call(engine: Engine, body: dict) -> dict:
    (req,), _ = engine.parse(body)
    gen = engine.start(req)
    return engine.finish(gen, gen.num_tokens)


def _prompt(text: str = "Tell me something.", tools=None) -> list[int]:
    return TOK.apply_chat_template([{"role": "user", "content": text}], tools)


def test_same_seed_prompt_and_params_give_identical_answers():
    body = {"input_ids": _prompt(), "rid": "r1", "sampling_params": {"max_new_tokens": 300, "temperature": 0.7},
            "return_logprob": True, "return_routed_experts": True}
    a, b = _call(_engine(), body), _call(_engine(), body)
    for out in (a, b):
        out["meta_info"].pop("e2e_latency")
        out["meta_info"].pop("cached_tokens")
    assert a == b
    c = _call(_engine(seed=1), body)
    assert c["output_ids"] != a["output_ids"]
    d = _call(_engine(), {**body, "sampling_params": {"max_new_tokens": 300, "temperature": 0.3}})
    assert d["output_ids"] != a["output_ids"]


def test_answer_decodes_with_rows_t_minus_one_and_matching_logprobs():
    prompt = _prompt()
    out = _call(_engine(), {"input_ids": prompt, "sampling_params": {"max_new_tokens": 64},
                            "return_logprob": True, "return_routed_experts": True, "routed_experts_start_len": 5})
    dec = decode_generate_response(out, prompt_len=len(prompt), routed_experts_start_len=5,
                                   num_layers=TINY.num_layers, topk=TINY.topk, want_routed_experts=True)
    n = len(out["output_ids"])
    assert dec.routed_experts.shape == (len(prompt) + n - 1 - 5, TINY.num_layers, TINY.topk)
    assert dec.output_ids.tolist() == out["output_ids"]
    assert np.all(dec.logprobs <= 0)
    assert out["meta_info"]["prompt_tokens"] == len(prompt)
    assert out["meta_info"]["completion_tokens"] == n


def test_routing_row_depends_only_on_its_prefix():
    r = RoutingModel(model_from_preset("qwen3.6-35b-a3b"), seed=7)
    a = np.array([5, 9, 2, 77, 3, 1, 4], dtype=np.int64)
    b = np.concatenate((a[:4], [8, 8, 8]))
    ea = r.routed_experts(r.prefix_hashes(a), 0, 6)
    eb = r.routed_experts(r.prefix_hashes(b), 0, 6)
    assert np.array_equal(ea[:4], eb[:4])
    assert not np.array_equal(ea[4:], eb[4:])
    # Slicing rows by start gives the same rows as the full computation.
    assert np.array_equal(r.routed_experts(r.prefix_hashes(a), 2, 6), ea[2:])


@pytest.mark.parametrize("experts,topk", [(256, 8), (12, 5), (512, 10), (3, 3)])
def test_routed_ids_are_in_range_and_distinct_per_row(experts, topk):
    r = RoutingModel(ModelSpec(name="m", num_layers=3, topk=topk, num_experts=experts), seed=0)
    ids = r.routed_experts(r.prefix_hashes(np.arange(2000) % 300), 0, 1999)
    assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < experts
    rows = np.sort(ids.reshape(-1, topk), axis=1)
    assert np.all(np.diff(rows, axis=1) > 0)
    if experts > topk:
        assert len(np.unique(ids)) == experts  # every expert gets used


def test_stop_length_ends_with_im_end_and_text_is_words():
    eng = _engine(mean_response_tokens=40)
    finishes = set()
    for i in range(12):
        out = _call(eng, {"input_ids": _prompt(f"q{i}"), "sampling_params": {"max_new_tokens": 100}})
        fr = out["meta_info"]["finish_reason"]
        finishes.add(fr["type"])
        if fr["type"] == "stop":
            assert fr["matched"] == TOK.im_end_token_id and out["output_ids"][-1] == TOK.im_end_token_id
            assert "<|im_end|>" not in out["text"]  # skip_special_tokens, as SGLang by default
        else:
            assert fr == {"type": "length", "length": 100} and len(out["output_ids"]) == 100
        words = out["text"].replace(".", " ").split()
        assert all(w.isalpha() for w in words)
    assert finishes == {"stop", "length"}


def test_ignore_eos_runs_to_max_new_tokens():
    out = _call(_engine(mean_response_tokens=5), {"input_ids": _prompt(),
                                                  "sampling_params": {"max_new_tokens": 77, "ignore_eos": True}})
    assert len(out["output_ids"]) == 77 and TOK.im_end_token_id not in out["output_ids"]


def test_stop_token_ids_and_stop_strings_cut_the_reply():
    eng = _engine(mean_response_tokens=10_000)
    space = ord(" ")
    out = _call(eng, {"input_ids": _prompt(), "sampling_params": {"max_new_tokens": 200, "stop_token_ids": [space]}})
    assert out["output_ids"][-1] == space and space not in out["output_ids"][:-1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": space}
    full = _call(eng, {"input_ids": _prompt(), "sampling_params": {"max_new_tokens": 200}})
    word = full["text"].split()[3]
    out = _call(eng, {"input_ids": _prompt(), "sampling_params": {"max_new_tokens": 200, "stop": [word]}})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert full["text"].startswith(out["text"]) and word not in out["text"]
    assert TOK.decode(out["output_ids"]).endswith(word)


def test_tool_call_rate_one_gives_well_formed_blocks_when_tools_offered():
    eng = _engine(tool_call_rate=1.0)
    prompt = _prompt("Find it", TOOLS)
    out = _call(eng, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 400}})
    text = out["text"]
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    body = text[text.index("<tool_call>\n") + len("<tool_call>\n"):text.index("\n</tool_call>")]
    call = json.loads(body)
    assert call["name"] == "lookup" and set(call["arguments"]) == {"query", "limit"}
    assert isinstance(call["arguments"]["limit"], int)
    # Without tools in the prompt the same engine answers in prose.
    plain = _call(eng, {"input_ids": _prompt("Find it"), "sampling_params": {"max_new_tokens": 400}})
    assert "<tool_call>" not in plain["text"]


@pytest.mark.parametrize("parameters", ["x", 5, ["a"], {"properties": "x"}, {"properties": ["a"]}])
def test_a_prompt_whose_tool_spec_has_no_schema_object_gets_a_call_without_arguments(parameters):
    # The specs are prompt text no request checked: the engine reads them as a model would, it does not fail.
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": parameters}}]
    text = _call(_engine(tool_call_rate=1.0), {"input_ids": _prompt("Find it", tools),
                                                "sampling_params": {"max_new_tokens": 400}})["text"]
    body = text[text.index("<tool_call>\n") + len("<tool_call>\n"):text.index("\n</tool_call>")]
    assert json.loads(body) == {"name": "lookup", "arguments": {}}


def test_answer_tool_results_replies_in_prose_after_a_tool_result_only():
    call = {"id": "c0", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    after_tool = TOK.apply_chat_template([{"role": "user", "content": "Find it"},
                                          {"role": "assistant", "content": None, "tool_calls": [call]},
                                          {"role": "tool", "tool_call_id": "c0", "content": "found"}], TOOLS)
    body = {"sampling_params": {"max_new_tokens": 400}}
    scripted, plain = _engine(tool_call_rate=1.0, answer_tool_results=True), _engine(tool_call_rate=1.0)
    assert "<tool_call>" not in _call(scripted, {"input_ids": after_tool, **body})["text"]
    assert "<tool_call>" in _call(plain, {"input_ids": after_tool, **body})["text"]
    # A user turn still gets its tool call.
    assert "<tool_call>" in _call(scripted, {"input_ids": _prompt("Find it", TOOLS), **body})["text"]


def test_cached_tokens_count_a_prefix_seen_before():
    eng = _engine()
    prompt = _prompt("x" * 100)
    first = _call(eng, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 20}})
    assert first["meta_info"]["cached_tokens"] == 0
    follow = prompt + first["output_ids"] + TOK.encode("\n<|im_start|>user\nmore<|im_end|>\n")
    second = _call(eng, {"input_ids": follow, "sampling_params": {"max_new_tokens": 20}})
    seen = len(prompt) + len(first["output_ids"])
    assert seen - 16 < second["meta_info"]["cached_tokens"] <= seen


def test_input_token_logprobs_from_logprob_start_len():
    prompt = _prompt()
    out = _call(_engine(), {"input_ids": prompt, "return_logprob": True, "logprob_start_len": 0,
                            "sampling_params": {"max_new_tokens": 4}})
    entries = out["meta_info"]["input_token_logprobs"]
    assert len(entries) == len(prompt) and entries[0][0] is None
    assert [e[1] for e in entries] == prompt and all(e[0] <= 0 for e in entries[1:])


@pytest.mark.parametrize("body,match", [
    ({}, "exactly one of input_ids or text"),
    ({"input_ids": [1, 2], "text": "x"}, "exactly one"),
    ({"input_ids": [1, "a"]}, r"input_ids\[1\]"),
    ({"input_ids": [1, 10**9]}, "not a token id"),
    ({"input_ids": [1], "sampling_params": {"max_new_token": 3}}, "unknown parameter.*max_new_token"),
    ({"input_ids": [1], "sampling_params": {"temperature": -1}}, "temperature"),
    ({"input_ids": [1], "return_logprob": "yes"}, "return_logprob"),
    ({"input_ids": [[1], [2]], "stream": True}, "batch"),
])
def test_malformed_requests_name_the_problem(body, match):
    with pytest.raises(EngineRequestError, match=match):
        _engine().parse(body)


def test_prompt_past_context_and_bad_routed_start_are_rejected():
    eng = _engine(context_length=50)
    with pytest.raises(EngineRequestError, match="maximum context length of 50 tokens.*total of 60"):
        eng.start(eng.parse({"input_ids": [1] * 40, "sampling_params": {"max_new_tokens": 20}})[0][0])
    with pytest.raises(EngineRequestError, match=r"The input \(50 tokens\) is longer"):
        eng.start(eng.parse({"input_ids": [1] * 50, "sampling_params": {"max_new_tokens": 0}})[0][0])
    # Left out, max_new_tokens is clamped to the room left instead.
    gen = eng.start(eng.parse({"input_ids": [1] * 45, "sampling_params": {"ignore_eos": True}})[0][0])
    assert gen.num_tokens == 4
    with pytest.raises(EngineRequestError, match="routed_experts_start_len"):
        eng.start(eng.parse({"input_ids": [1] * 4, "return_routed_experts": True,
                             "routed_experts_start_len": 4, "sampling_params": {"max_new_tokens": 1}})[0][0])


def test_config_validation_names_the_key():
    with pytest.raises(ConfigError, match="engine.tool_call_rate"):
        EngineConfig(tool_call_rate=2.0)
    with pytest.raises(ConfigError, match="engine.port"):
        EngineConfig(port=70000)
    with pytest.raises(ConfigError, match="model.topk"):
        model_from_preset("tiny-moe", topk=99)
    assert model_from_preset("qwen3.6-35b-a3b", num_layers=2).num_layers == 2


def test_shorter_max_new_tokens_gives_a_prefix_of_the_longer_reply():
    eng = _engine(mean_response_tokens=10_000)
    body = {"input_ids": _prompt(), "return_logprob": True}
    short = _call(eng, {**body, "sampling_params": {"max_new_tokens": 50}})
    long = _call(eng, {**body, "sampling_params": {"max_new_tokens": 500}})
    assert long["output_ids"][:50] == short["output_ids"]
    assert long["meta_info"]["output_token_logprobs"][:50] == short["meta_info"]["output_token_logprobs"]


def test_cli_answer_tool_results_flag_reaches_the_config():
    import argparse

    from dressage.cli.engine import config_from_args, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    on = config_from_args(parser.parse_args(["engine", "serve", "--tool-call-rate", "1", "--answer-tool-results"]))
    off = config_from_args(parser.parse_args(["engine", "serve"]))
    assert (on.answer_tool_results, on.tool_call_rate) == (True, 1.0) and off.answer_tool_results is False
