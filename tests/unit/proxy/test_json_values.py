"""The checks behind the schemas' Shallow and Storable: nesting measured on values and on JSON text,
storable scalars, each refusal naming the place by its dotted path."""

from __future__ import annotations

import json

import pytest

from dressage.proxy.json_values import (INT64_MAX, INT64_MIN, MAX_DEPTH, nesting_problem, storable_problem,
                                        text_too_deep)


def _nested(depth: int) -> object:
    return json.loads("[" * depth + "]" * depth)


def test_nesting_is_counted_in_levels_of_arrays_and_objects():
    assert nesting_problem(_nested(MAX_DEPTH)) is None
    assert "deeper than 64" in nesting_problem(_nested(MAX_DEPTH + 1))
    assert nesting_problem({"a": {"b": _nested(MAX_DEPTH)}}).startswith("a.b.0.0.")  # names where it happens
    assert nesting_problem({"a": _nested(MAX_DEPTH)}).split(":")[0].endswith(".0...")  # a long path is cut
    assert nesting_problem({"a": [{"b": 1}]}, limit=2) == "a.0: nested deeper than 2 levels of arrays and objects"


def test_json_text_under_arguments_is_measured_without_parsing():
    deep = "{\"x\": " + "[" * 500 + "]" * 500 + "}"
    assert text_too_deep(deep) and not text_too_deep("{\"x\": [[1]]}")
    # Brackets inside strings (escaped quotes included) are text, not nesting.
    assert not text_too_deep(json.dumps({"s": "[" * 500 + "\\\"" + "{" * 500}))
    assert not text_too_deep("not json at all [[[", limit=3) and text_too_deep("[[[[", limit=3)
    call = {"function": {"name": "f", "arguments": deep}}
    assert nesting_problem([call]) == "0.function.arguments: JSON text nested deeper than 64 levels"
    assert nesting_problem([{"function": {"name": deep}}]) is None  # only arguments are JSON text


@pytest.mark.parametrize("value, where", [
    ({"a": INT64_MAX + 1}, "a: the integer"),
    ({"a": [1, INT64_MIN - 1]}, "a.1: the integer"),
    ({"a": float("nan")}, "a: nan is not a finite number"),
    ({"a": {1: "x"}}, "a: the key 1 is not a string"),
    ({"a": {"b": object()}}, "a.b: a object is not a JSON value"),
    (2**70, ": the integer"),
])
def test_storable_refuses_what_no_format_holds(value, where):
    assert storable_problem(value).startswith(where)


def test_storable_keeps_every_json_value_within_range():
    value = {"i": [INT64_MIN, INT64_MAX, 0], "f": -1.5e300, "s": "é", "b": True, "n": None,
             "d": _nested(MAX_DEPTH - 1)}
    assert storable_problem(value) is None
