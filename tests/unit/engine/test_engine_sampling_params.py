"""The built-in engine's SGLang sampling parameters: honoured (seed, greedy, penalties, json_schema,
ebnf, top logprobs) or refused by name (regex / structural tag / logit_bias / n)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from dressage.engine import Engine, EngineConfig
from dressage.fields.config import model_from_preset
from dressage.engine.json_schema import parse_schema, sample_json
from dressage.errors import EngineRequestError
from dressage.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
ENGINE = Engine(EngineConfig(model=model_from_preset("tiny-moe"), seed=9, mean_response_tokens=400))


def _answer(sp: dict, text: str = "Say something long.", **top) -> dict:
    body = {"input_ids": TOK.apply_chat_template([{"role": "user", "content": text}]),
            "sampling_params": {"max_new_tokens": 400, **sp}, "return_logprob": True, **top}
    (req,), _ = ENGINE.parse(body)
    gen = ENGINE.start(req)
    return ENGINE.finish(gen, gen.num_tokens)


def _words(out: dict) -> list[str]:
    return out["text"].replace(".", " ").lower().split()


@pytest.mark.parametrize("key,value,what", [("regex", "a+", "regex"), ("structural_tag", '{"type": "structural_tag"}', "structural"),
                                            ("logit_bias", {"5": -100}, "logit_bias"), ("stop_regex", "x", "regex"),
                                            ("n", 2, "one sample"), ("custom_params", {"a": 1}, "custom")])
def test_parameters_it_cannot_honour_are_refused_by_name(key, value, what):
    with pytest.raises(EngineRequestError, match=what) as info:
        _answer({key: value})
    assert key in str(info.value) and info.value.status_code == 400


@pytest.mark.parametrize("key,value", [("top_k", 0), ("min_p", 1.5), ("frequency_penalty", 2.5),
                                       ("presence_penalty", -3), ("repetition_penalty", 0), ("top_k", "5")])
def test_out_of_range_values_are_400s(key, value):
    with pytest.raises(EngineRequestError, match=key):
        _answer({key: value})


def test_seed_decides_the_draw_and_greedy_ignores_it():
    a, b, c = (_answer({"sampling_seed": s, "temperature": 0.9}) for s in (1, 1, 2))
    assert a["output_ids"] == b["output_ids"] != c["output_ids"]
    g1, g2 = (_answer({"sampling_seed": s, "temperature": 0.0}) for s in (1, 2))
    k1, k2 = (_answer({"sampling_seed": s, "top_k": 1}) for s in (1, 2))
    assert g1["output_ids"] == g2["output_ids"] and k1["output_ids"] == k2["output_ids"]
    assert _answer({"top_k": 40})["output_ids"] != _answer({})["output_ids"]


def test_defaults_keep_the_draw_of_a_request_without_the_new_parameters():
    explicit = {"top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                "repetition_penalty": 1.0}
    assert _answer(explicit)["output_ids"] == _answer({})["output_ids"]


def test_penalties_change_how_often_words_repeat():
    def distinct(sp):
        ratios = []
        for i in range(4):
            words = _words(_answer({"ignore_eos": True, **sp}, f"Prompt number {i}."))
            ratios.append(len(set(words)) / len(words))
        return float(np.mean(ratios))

    base = distinct({})
    assert distinct({"presence_penalty": 2.0}) > base + 0.05
    assert distinct({"frequency_penalty": 1.5, "repetition_penalty": 1.5}) > base + 0.05
    assert distinct({"presence_penalty": -2.0}) < base - 0.05


def test_json_schema_replies_are_documents_of_the_schema():
    schema = {"type": "object", "$defs": {"Item": {"type": "object", "properties": {"id": {"type": "integer"}},
                                                   "required": ["id"]}},
              "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "minItems": 2},
                             "label": {"anyOf": [{"type": "string", "minLength": 3}, {"type": "null"}]},
                             "kind": {"const": "report"}},
              "required": ["items", "label", "kind"]}
    for i in range(5):
        out = _answer({"json_schema": json.dumps(schema)}, f"json {i}")
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        doc = json.loads(out["text"])
        assert doc["kind"] == "report" and len(doc["items"]) >= 2
        assert all(isinstance(it["id"], int) for it in doc["items"]) and len(doc["label"]) >= 3


def test_ebnf_replies_are_texts_of_the_grammar_and_their_tokens_its_encoding():
    grammar = 'root ::= "<call>" name (", " arg){1,3} "</call>"\nname ::= "f" | "g"\narg ::= [0-9]+ | "x" [^<,]*'
    texts = set()
    for i in range(8):
        out = _answer({"ebnf": grammar, "sampling_seed": i}, f"grammar {i}")
        text = out["text"]
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        assert re.fullmatch(r"<call>[fg](, ([0-9]+|x[^<,]*)){1,3}</call>", text), text
        assert out["output_ids"][:-1] == TOK.encode(text) and out["output_ids"][-1] == TOK.im_end_token_id
        assert len(out["meta_info"]["output_token_logprobs"]) == len(out["output_ids"])
        texts.add(text)
    assert len(texts) > 4  # the seed draws the derivation
    again = _answer({"ebnf": grammar, "sampling_seed": 3}, "grammar 3")
    assert again["text"] == _answer({"ebnf": grammar, "sampling_seed": 3}, "grammar 3")["text"]


def test_a_recursive_grammar_always_ends():
    grammar = 'root ::= value\nvalue ::= "[" (value (", " value)*)? "]" | "1"'
    for i in range(10):
        text = _answer({"ebnf": grammar, "sampling_seed": i}, f"deep {i}")["text"]
        assert json.loads(text) is not None


@pytest.mark.parametrize("grammar,word", [("root ::= missing", "undefined"), ("x ::= \"a\"", "no root"),
                                          ('root ::= "a', "unterminated"), ("root ::= root", "no finite"),
                                          ("root ::= 'a'", "unexpected"), ("", "non-empty")])
def test_a_bad_grammar_is_a_400_naming_ebnf(grammar, word):
    with pytest.raises(EngineRequestError, match=word) as info:
        _answer({"ebnf": grammar})
    assert "sampling_params.ebnf" in str(info.value) and info.value.status_code == 400


@pytest.mark.parametrize("schema,word", [({"type": "string", "pattern": "a"}, "pattern"),
                                         ({"oneOf": [{"type": "string"}]}, "oneOf"),
                                         ({"$ref": "http://x/s.json"}, "local"),
                                         ({"type": "strng"}, "unknown type")])
def test_json_schema_keywords_it_cannot_honour_are_refused(schema, word):
    with pytest.raises(EngineRequestError, match=word):
        _answer({"json_schema": json.dumps(schema)})
    with pytest.raises(EngineRequestError, match="not JSON"):
        _answer({"json_schema": "{"})


def test_sample_json_respects_bounds():
    schema = parse_schema(json.dumps({"type": "array", "items": {"type": "number", "minimum": -1, "maximum": 1},
                                      "minItems": 3, "maxItems": 3}))
    for s in range(10):
        doc = sample_json(np.random.default_rng(s), schema, schema)
        assert len(doc) == 3 and all(-1 <= v <= 1 for v in doc)


def test_top_logprobs_are_a_distribution_head_with_the_sampled_token():
    out = _answer({"max_new_tokens": 30}, "short", top_logprobs_num=4, return_text_in_logprobs=True)
    tops, chosen = out["meta_info"]["output_top_logprobs"], out["meta_info"]["output_token_logprobs"]
    assert len(tops) == len(chosen) == len(out["output_ids"])
    for alts, (lp, tid, _) in zip(tops, chosen):
        assert len(alts) == 4 and [a[0] for a in alts] == sorted((a[0] for a in alts), reverse=True)
        assert [lp, tid] in [a[:2] for a in alts] and sum(np.exp([a[0] for a in alts])) <= 1 + 1e-6
        assert len({a[1] for a in alts}) == 4 and all(a[2] == TOK.decode([a[1]]) for a in alts)
    assert "output_top_logprobs" not in _answer({"max_new_tokens": 5})["meta_info"]
