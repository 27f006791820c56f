"""The JSON values the Proxy accepts into what it stores or parses: bounded nesting, storable scalars.

Checked at the edge (the request schemas) so that whatever was accepted can later be journaled, written
as msgpack or JSON, and parsed again without a recursion limit or an integer range failing after the fact.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = ["MAX_DEPTH", "INT64_MIN", "INT64_MAX", "nesting_problem", "storable_problem", "text_too_deep",
           "lone_surrogate"]

MAX_DEPTH = 64
"""Levels of arrays and objects one value may nest (a tool call's JSON text counts on its own): far more
than any tool schema or metadata needs, far below the encoders' own limits (orjson's 255, the stdlib's
recursion limit), which would otherwise fail after the value was accepted."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The integers msgpack, the journal and the trainer's readers all hold."""

_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def text_too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON text ``text`` nests arrays and objects deeper than ``limit`` (brackets inside
    strings do not count; text that is not JSON is measured the same way, without parsing it)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for m in _JSON_TOKENS.finditer(text):
        c = m.group()
        if c == "[" or c == "{":
            depth += 1
            if depth > limit:
                return True
        elif c == "]" or c == "}":
            depth -= 1
    return False


def lone_surrogate(value: Any) -> str | None:
    """The first lone UTF-16 surrogate in the strings of ``value`` (parsed JSON, keys included), escaped
    (``\\ud800``); ``None`` when there is none. Such a string is not Unicode text: no tokenizer, journal or
    UTF-8 answer can hold it."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.object[exc.start:exc.end].encode("unicode_escape").decode()
    return None


def _where(path: tuple[Any, ...]) -> str:
    if len(path) > 12:  # the first steps say where; 60 more ".0" say nothing
        return ".".join(str(p) for p in path[:12]) + "..."
    return ".".join(str(p) for p in path)


def nesting_problem(value: Any, path: tuple[Any, ...] = (), limit: int = MAX_DEPTH) -> str | None:
    """Why ``value`` (parsed JSON) nests too deep, naming the place by its dotted path; ``None`` when it
    does not. A string under an ``arguments`` key (a tool call's arguments, JSON text) is measured too."""
    if type(value) is not dict and type(value) is not list or not _too_deep(value, limit):
        return None
    return _walk(value, path, limit, storable=False)  # again, naming the place (only for a refusal)


def _too_deep(value: Any, limit: int) -> bool:
    # The check every chat call pays for (~0.5 us per message): no paths, the containers only.
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth >= limit:
            return True
        if type(item) is dict:
            args = item.get("arguments")
            if type(args) is str and text_too_deep(args, limit):
                return True
            children = item.values()
        else:
            children = item
        for child in children:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, depth + 1))
    return False


def storable_problem(value: Any, path: tuple[Any, ...] = (), limit: int = MAX_DEPTH) -> str | None:
    """Why ``value`` cannot be stored as it is (nested too deep, an integer outside int64, a number that is
    not finite, a key that is not a string, a type JSON does not have), naming the place; ``None`` if it can."""
    return _walk(value, path, limit, storable=True)


def _walk(value: Any, path: tuple[Any, ...], limit: int, *, storable: bool) -> str | None:
    stack: list[tuple[Any, tuple[Any, ...], int]] = [(value, path, 0)]
    while stack:
        item, at, depth = stack.pop()
        if isinstance(item, dict):
            if depth >= limit:
                return f"{_where(at)}: nested deeper than {limit} levels of arrays and objects"
            for key, child in item.items():
                if storable and not isinstance(key, str):
                    return f"{_where(at)}: the key {key!r} is not a string"
                if isinstance(child, (dict, list)):
                    stack.append((child, (*at, key), depth + 1))
                elif key == "arguments" and isinstance(child, str) and text_too_deep(child, limit):
                    return f"{_where((*at, key))}: JSON text nested deeper than {limit} levels"
                elif storable and (why := _scalar_problem(child)) is not None:
                    return f"{_where((*at, key))}: {why}"
        elif isinstance(item, list):
            if depth >= limit:
                return f"{_where(at)}: nested deeper than {limit} levels of arrays and objects"
            for i, child in enumerate(item):
                if isinstance(child, (dict, list)):
                    stack.append((child, (*at, i), depth + 1))
                elif storable and (why := _scalar_problem(child)) is not None:
                    return f"{_where((*at, i))}: {why}"
        elif storable and (why := _scalar_problem(item)) is not None:
            return f"{_where(at)}: {why}"
    return None


def _scalar_problem(value: Any) -> str | None:
    if value is None or isinstance(value, (bool, str)):
        return None
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            return f"the integer {str(value)[:40]} is outside the 64-bit signed range"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} is not a finite number"
    return f"a {type(value).__name__} is not a JSON value"
