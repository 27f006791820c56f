"""The function tools a call offers and the tool calls its conversation sends back: one set of rules.

Chat ``tools``, Responses function and namespace tools and Anthropic client tools all become chat
function tools, and each endpoint checks its own with these helpers, naming the field as its client sent
it: a function needs a name the model's call syntax can carry (:data:`FUNCTION_NAME`: the tool-call
grammar and parsers put it between quotes and tags as it is), its schema is a JSON Schema object, and
names are unique. A tool call sent back carries ``arguments`` that are a JSON text of Unicode text.
Malformed values are :class:`~dressage.errors.InputValueError` (``invalid_value``), a tool type no
endpoint serves :class:`~dressage.errors.UnsupportedParameterError`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

from dressage.errors import InputValueError, UnsupportedParameterError
from dressage.proxy.json_values import lone_surrogate

__all__ = ["FUNCTION_NAME", "check_name", "check_function", "check_unique_names", "check_arguments", "refuse_tool_type",
           "chat_function_tools"]

FUNCTION_NAME = re.compile(r"[\w.-]+")
"""A function name: letters, digits, ``_``, ``-`` and ``.`` (a namespaced Responses function's ``NS.name``).
OpenAI and Anthropic allow fewer; a quote, blank or tag character would break the model's call syntax."""

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def check_name(value: Any, at: str, what: str = "function tool") -> str:
    """Check a function (or namespace) name at ``at``; returns it."""
    if not isinstance(value, str) or not value:
        raise InputValueError(f"a {what} needs a name (a non-empty string)", at)
    if not FUNCTION_NAME.fullmatch(value):
        raise InputValueError(f"{value!r} cannot name a {what}: letters, digits, '_', '-' and '.' only (the "
                              f"model writes the name inside its tool-call syntax)", at)
    return value


def check_function(fn: dict[str, Any], at: str, *, schema: str = "parameters", what: str = "function tool",
                   schema_required: bool = False) -> str:
    """Check one function's ``name``, ``description``, JSON Schema (the field ``schema``) and ``strict``,
    found at ``at`` (``tools[0].function``); returns the name."""
    name = check_name(fn.get("name"), f"{at}.name", what)
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise InputValueError("must be a string", f"{at}.description")
    spec = fn.get(schema)
    if not isinstance(spec, dict) and (spec is not None or schema_required):
        raise InputValueError(f"a {what} needs a JSON Schema object", f"{at}.{schema}")
    if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
        raise InputValueError("must be true or false", f"{at}.strict")
    return name


def check_unique_names(named: Iterable[tuple[str, str]]) -> None:
    """Refuse a function name given twice; ``named`` is (name, where it was given) in request order."""
    seen: dict[str, str] = {}
    for name, at in named:
        if name in seen:
            raise InputValueError(f"{name!r} is given twice (first at {seen[name]}): function names must be unique", at)
        seen[name] = at


def refuse_tool_type(kind: Any, at: str, served: str) -> InputValueError | UnsupportedParameterError:
    """The 400 for a tool type the Proxy does not serve (``served`` says which it does), or for no type."""
    if not isinstance(kind, str):
        return InputValueError(f"a tool needs a type; {served}", at)
    if kind == "custom":
        why = "a custom tool's free-form input is no call the model's tool-call parser reads"
    else:
        why = "it is a hosted OpenAI tool, which this Proxy does not run"
    return UnsupportedParameterError(at, f"tool type {kind!r} is not served ({why}); {served}")


def check_arguments(arguments: Any, at: str) -> None:
    """Check a tool call's ``arguments`` sent back in a conversation: a JSON text (or an object, or
    nothing) whose strings are Unicode text, as the chat template reads it."""
    if arguments is None or isinstance(arguments, dict):
        return  # an object came through the body's own JSON, which the request guard checked
    if not isinstance(arguments, str):
        raise InputValueError("must be a JSON text (a string)", at)
    if not arguments.strip():
        return  # read as no arguments
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError) as exc:
        raise InputValueError(f"is not a JSON text: {exc}", at) from None
    surrogate = lone_surrogate(value) if _SURROGATE_ESCAPE.search(arguments) else None
    if surrogate is not None:
        raise InputValueError(f"the JSON text holds a lone UTF-16 surrogate ({surrogate}), which is not valid "
                              f"Unicode text", at)


def chat_function_tools(tools: list[Any] | None) -> None:
    """Check a chat request's ``tools``: function tools only (``type`` left out reads as ``function``,
    as SGLang and vLLM read it), each well formed, names unique."""
    named = []
    for i, tool in enumerate(tools or ()):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InputValueError("must be an object", at)
        if tool.get("type", "function") != "function":
            raise refuse_tool_type(tool.get("type"), f"{at}.type", "function tools are served")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise InputValueError('a function tool needs a "function" object (name, description, parameters)',
                                  f"{at}.function")
        named.append((check_function(fn, f"{at}.function"), f"{at}.function.name"))
    check_unique_names(named)
