"""Hermes / Qwen JSON calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

Qwen2.5, Qwen3 and the built-in engine write them (SGLang's ``qwen`` / ``qwen25`` parser).
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from dressage.proxy.parsers.base import THINK, ParsedCall, ToolCallParser

__all__ = ["HermesParser", "json_call"]


def json_call(body: str) -> tuple[str, str] | None:
    """(name, arguments JSON) of a ``{"name": ..., "arguments": ...}`` object (``parameters`` is read
    too), ``None`` when ``body`` is not one."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return obj["name"], args if isinstance(args, str) else json.dumps(args)


class HermesParser(ToolCallParser):
    name = "qwen"
    markers = ("<tool_call>",)
    default_reasoning = THINK
    _CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

    def find_calls(self, text: str, tools: Sequence[dict[str, Any]] | None = None) -> list[ParsedCall]:
        out = []
        for m in self._CALL.finditer(text):
            call = json_call(m.group(1))
            if call is not None:  # not well formed: it stays in the content
                out.append(ParsedCall(m.start(), m.end(), *call))
        return out
