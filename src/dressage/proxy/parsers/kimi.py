"""Kimi-K2 calls: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
<|tool_call_argument_begin|>ARGS<|tool_call_end|>...<|tool_calls_section_end|>``.

The call id is the model's own ``functions.NAME:IDX`` (the template writes it back as the id).
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from dressage.proxy.parsers.base import THINK, ParsedCall, ToolCallParser

__all__ = ["KimiK2Parser", "SECTION_BEGIN", "SECTION_END", "CALL_BEGIN", "ARG_BEGIN", "CALL_END"]

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARG_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"

_SECTION = re.compile(re.escape(SECTION_BEGIN) + r"(.*?)(?:" + re.escape(SECTION_END) + r"|$)", re.DOTALL)
_ONE = re.compile(re.escape(CALL_BEGIN) + r"\s*(?:functions\.)?([^\s:<]+):(\d+)\s*" + re.escape(ARG_BEGIN)
                  + r"(.*?)" + re.escape(CALL_END), re.DOTALL)


class KimiK2Parser(ToolCallParser):
    name = "kimi_k2"
    markers = (SECTION_BEGIN,)
    special_markers = True
    default_reasoning = THINK

    def find_calls(self, text: str, tools: Sequence[dict[str, Any]] | None = None) -> list[ParsedCall]:
        out: list[ParsedCall] = []
        for section in _SECTION.finditer(text):
            calls = []
            for m in _ONE.finditer(section.group(1)):
                try:
                    ok = isinstance(json.loads(m.group(3)), dict)
                except ValueError:
                    ok = False
                if ok:
                    calls.append((m.group(1), m.group(3).strip(), f"functions.{m.group(1)}:{m.group(2)}"))
            for i, (name, args, call_id) in enumerate(calls):
                start, end = (section.start(), section.end()) if i == 0 else (section.end(), section.end())
                out.append(ParsedCall(start, end, name, args, call_id))
        return out
