"""DeepSeek-V3 and V3.1 / V3.2 calls inside ``<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>``.

V3 (``deepseekv3``): ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>``;
V3.1 and V3.2-Exp (``deepseekv31``): ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from dressage.proxy.parsers.base import ParsedCall, ReasoningParser, ToolCallParser

__all__ = ["DeepSeekV3Parser", "DeepSeekV31Parser", "CALLS_BEGIN", "CALLS_END", "CALL_BEGIN", "CALL_END", "SEP"]

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

_SECTION = re.compile(re.escape(CALLS_BEGIN) + r"(.*?)(?:" + re.escape(CALLS_END) + r"|$)", re.DOTALL)
_ONE = re.compile(re.escape(CALL_BEGIN) + r"(.*?)" + re.escape(CALL_END), re.DOTALL)
_V3 = re.compile(r"^(\w+)" + re.escape(SEP) + r"([^\n]+)\n```json\n(.*)\n```$", re.DOTALL)
_V31 = re.compile(r"^([^\n]+?)" + re.escape(SEP) + r"(.*)$", re.DOTALL)


def _json_args(raw: str) -> str | None:
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return raw if isinstance(obj, dict) else None


class _DeepSeekParser(ToolCallParser):
    markers = (CALLS_BEGIN,)
    # R1 and V3.1 thinking open the block in the prompt: the reply holds only its end.
    default_reasoning = ReasoningParser("deepseek-r1", implicit_open=True)

    def _call(self, body: str) -> tuple[str, str] | None:
        raise NotImplementedError

    def find_calls(self, text: str, tools: Sequence[dict[str, Any]] | None = None) -> list[ParsedCall]:
        out = []
        for section in _SECTION.finditer(text):
            calls = []
            for m in _ONE.finditer(section.group(1)):
                call = self._call(m.group(1))
                if call is not None:
                    calls.append(call)
            if calls:  # the section goes with its calls: its first call carries the whole span
                out.append(ParsedCall(section.start(), section.end(), *calls[0]))
                out.extend(ParsedCall(section.end(), section.end(), *c) for c in calls[1:])
        return out


class DeepSeekV3Parser(_DeepSeekParser):
    name = "deepseekv3"

    def _call(self, body: str) -> tuple[str, str] | None:
        m = _V3.match(body)
        args = None if m is None else _json_args(m.group(3))
        return None if args is None else (m.group(2).strip(), args)


class DeepSeekV31Parser(_DeepSeekParser):
    name = "deepseekv31"

    def _call(self, body: str) -> tuple[str, str] | None:
        m = _V31.match(body)
        args = None if m is None else _json_args(m.group(2))
        return None if args is None else (m.group(1).strip(), args)
