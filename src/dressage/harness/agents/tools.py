"""The agents' built-in tools: a calculator and a fact lookup, both pure functions of their arguments.

A tool call the agent cannot run (unknown name, arguments that are not JSON or of the wrong type)
still gets a ``role: tool`` answer, an error text, as a real agent framework would send back.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["TOOL_SPECS", "ToolResult", "execute_tool", "LOOKUP_TABLE", "TOOL_ERROR_PREFIX"]

TOOL_ERROR_PREFIX = "error:"
"""Every failed call's tool message starts with this (the reward counts them)."""

LOOKUP_TABLE: Mapping[str, str] = {
    "boiling_point_water_c": "100",
    "speed_of_light_km_s": "299792",
    "days_per_leap_year": "366",
    "planets_in_solar_system": "8",
    "bits_per_byte": "8",
    "moe_layers_glm": "75",
    "moe_layers_qwen": "40",
    "routing_topk": "8",
}

_OPS = ("add", "sub", "mul", "div", "pow")

TOOL_SPECS: tuple[dict[str, Any], ...] = (
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Apply an arithmetic operation to two numbers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "op": {"type": "string", "enum": list(_OPS)},
                    "a": {"type": "number"},
                    "b": {"type": "number"},
                },
                "required": ["op", "a", "b"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a reference fact by its key.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string", "enum": sorted(LOOKUP_TABLE)}},
                "required": ["key"],
            },
        },
    },
)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool call produced: the text for the ``role: tool`` message, and whether it worked."""

    content: str
    ok: bool


def _number(args: Mapping[str, Any], name: str) -> float:
    value = args.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"argument {name!r} must be a number, got {value!r}")
    return float(value)


def _format(x: float) -> str:
    if not math.isfinite(x):
        raise ValueError("the result is not a finite number")
    return str(int(x)) if x == int(x) and abs(x) < 1e15 else f"{x:.6g}"


def _calculator(args: Mapping[str, Any]) -> str:
    op = args.get("op")
    if op not in _OPS:
        raise ValueError(f"argument 'op' must be one of {', '.join(_OPS)}, got {op!r}")
    a, b = _number(args, "a"), _number(args, "b")
    if op == "div" and b == 0:
        raise ValueError("division by zero")
    if op == "pow" and abs(b) > 64:
        raise ValueError("exponent too large")  # keeps every result small and finite
    if op == "pow" and a < 0 and b != int(b):
        raise ValueError("a negative base needs an integer exponent")
    if op == "add":
        return _format(a + b)
    if op == "sub":
        return _format(a - b)
    if op == "mul":
        return _format(a * b)
    return _format(a / b if op == "div" else a ** b)


def _lookup(args: Mapping[str, Any]) -> str:
    key = args.get("key")
    if not isinstance(key, str) or key not in LOOKUP_TABLE:
        raise ValueError(f"no fact with key {key!r}")
    return f"{key} = {LOOKUP_TABLE[key]}"


_TOOLS = {"calculator": _calculator, "lookup": _lookup}


def execute_tool(name: str | None, arguments: str | Mapping[str, Any] | None) -> ToolResult:
    """Run one tool call; ``arguments`` is OpenAI's JSON string (or an already decoded object)."""
    fn = _TOOLS.get(name or "")
    if fn is None:
        return ToolResult(f"{TOOL_ERROR_PREFIX} unknown tool {name!r}", ok=False)
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolResult(f"{TOOL_ERROR_PREFIX} arguments are not JSON: {exc.msg}", ok=False)
    if not isinstance(arguments, Mapping):
        return ToolResult(f"{TOOL_ERROR_PREFIX} arguments must be a JSON object", ok=False)
    try:
        return ToolResult(fn(arguments), ok=True)
    except (ValueError, OverflowError) as exc:
        return ToolResult(f"{TOOL_ERROR_PREFIX} {exc}", ok=False)
