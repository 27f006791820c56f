"""Qwen3-Coder / Qwen3.5 / Qwen3.6 XML calls, parameter values typed by the tool's JSON schema::

    <tool_call>
    <function=NAME>
    <parameter=P>
    value
    </parameter>
    </function>
    </tool_call>

A ``<tool_call>`` holding a JSON object (the Hermes form) is read too: the same models write it
when prompted with that form, and the built-in engine does.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from dressage.proxy.parsers.base import THINK, ParsedCall, ToolCallParser, tool_schemas, typed_call, written_value
from dressage.proxy.parsers.hermes import json_call

__all__ = ["QwenXmlParser", "render_xml_call"]

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"^<function=([^>\n]+)>(.*?)</function>$", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def render_xml_call(name: str, args: dict[str, Any]) -> str:
    """A call as the Qwen3-Coder template writes it (strings raw, other values as JSON)."""
    params = "".join(f"<parameter={k}>\n{written_value(v)}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


class QwenXmlParser(ToolCallParser):
    name = "qwen3_coder"
    markers = ("<tool_call>",)
    default_reasoning = THINK

    def find_calls(self, text: str, tools: Sequence[dict[str, Any]] | None = None) -> list[ParsedCall]:
        schemas = tool_schemas(tools)
        out = []
        for m in _CALL.finditer(text):
            body = m.group(1)
            fn = _FUNCTION.match(body)
            if fn is None:
                call = json_call(body)
                if call is not None:
                    out.append(ParsedCall(m.start(), m.end(), *call))
                continue
            name = fn.group(1).strip()
            inner = fn.group(2)
            if _PARAM.sub("", inner).strip():
                continue  # text between parameters: not a call of this form
            pairs = [(key, _strip_one_newline(raw)) for key, raw in _PARAM.findall(inner)]
            out.append(typed_call(m.start(), m.end(), name, pairs, schemas))
        return out
