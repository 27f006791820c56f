"""``tool_choice`` as an engine grammar: every text the grammar derives is a call of the family's
syntax, to an allowed function, with arguments valid for its JSON schema."""

import json

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.engine.ebnf import parse_grammar
from dressage.errors import UnsupportedParameterError
from dressage.proxy.parsers import assistant_message, forced_tool, make_parser, tool_call_constraint

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "unit": {"enum": ["c", "f"]}, "ratio": {"type": "number"}, "opts": {"type": "object"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "where": {"type": "object", "properties": {"lat": {"type": "number"}, "name": {"type": ["string", "null"]}},
              "required": ["lat"]}}, "required": ["city", "days"]}
SEARCH = {"type": "object", "properties": {"q": {"type": "string"}, "k": {"anyOf": [{"type": "integer"},
                                                                                     {"const": "all"}]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "search", "parameters": SEARCH}}]
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH}
FAMILIES = ["qwen", "qwen3_coder", "glm45", "glm47", "deepseekv3", "deepseekv31", "kimi_k2", "gpt-oss"]


def _calls(family, choice, seed, single=False, tools=TOOLS):
    grammar = parse_grammar(tool_call_constraint(tools, choice, family, single_call=single)["ebnf"])
    text = grammar.sample(np.random.default_rng(seed))
    msg = assistant_message(make_parser(family), text, call_id_prefix="c", tools=tools)
    return text, msg


@settings(max_examples=80, deadline=None)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**31),
       choice=st.sampled_from(["required", "any", {"type": "function", "function": {"name": "search"}},
                               {"type": "tool", "name": "get_weather"}]),
       single=st.booleans())
def test_every_text_of_the_grammar_is_a_valid_call(family, seed, choice, single):
    text, msg = _calls(family, choice, seed, single)
    calls = msg.get("tool_calls")
    assert calls, text
    assert not (msg["content"] or "").strip()  # the reply is the calls alone
    _, named = forced_tool(choice)
    for c in calls:
        name, args = c["function"]["name"], json.loads(c["function"]["arguments"])
        assert name == named if named else name in SCHEMAS
        jsonschema.validate(args, SCHEMAS[name])
    if single or family == "gpt-oss":
        assert len(calls) == 1


def test_many_seeds_draw_both_tools_and_several_calls():
    names, counts = set(), set()
    for seed in range(60):
        _, msg = _calls("qwen3_coder", "required", seed)
        names.update(c["function"]["name"] for c in msg["tool_calls"])
        counts.add(len(msg["tool_calls"]))
    assert names == {"get_weather", "search"} and {1, 2} <= counts


def test_nothing_is_forced_under_auto_or_none_and_a_bad_choice_is_a_400_naming_tool_choice():
    for choice in ("auto", "none", None, {"type": "auto"}):
        assert tool_call_constraint(TOOLS, choice, "qwen") is None
    with pytest.raises(UnsupportedParameterError) as info:
        tool_call_constraint(TOOLS, {"type": "tool", "name": "nope"}, "qwen")
    assert info.value.param == "tool_choice"
    with pytest.raises(UnsupportedParameterError, match="needs tools"):
        tool_call_constraint([], "required", "qwen")


def test_anthropic_tools_are_read_too():
    tools = [{"name": "search", "input_schema": SEARCH}]
    text, msg = _calls("qwen", {"type": "tool", "name": "search"}, 3, tools=tools)
    assert msg["tool_calls"][0]["function"]["name"] == "search"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("required", [5, "city", [["city"]], {"city": True}])
def test_a_required_that_is_no_list_of_names_constrains_nothing(family, required):
    # The schema's other keywords still hold; a malformed required is one more keyword the grammar does not read.
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": required}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    for seed in range(4):
        text, msg = _calls(family, "required", seed, single=True, tools=tools)
        (call,) = msg["tool_calls"]
        assert call["function"]["name"] == "f", text
        assert set(json.loads(call["function"]["arguments"])) <= {"city"}
