"""GLM-4.5 / 4.6 / 4.7 / 5 calls: ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n...</tool_call>``.

Values are written raw when strings, as JSON otherwise (the GLM templates' ``tojson`` for
non-strings); they are read back typed by the tool's JSON schema. GLM-4.7 drops the newlines.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from dressage.proxy.parsers.base import THINK, ParsedCall, ToolCallParser, tool_schemas, typed_call, written_value

__all__ = ["GlmParser", "render_glm_call"]

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def render_glm_call(name: str, args: dict[str, Any], *, newlines: bool = True) -> str:
    """A call as the GLM-4.5 template writes it (``newlines=False``: GLM-4.7's)."""
    nl = "\n" if newlines else ""
    pairs = "".join(f"<arg_key>{k}</arg_key>{nl}<arg_value>"
                    f"{written_value(v)}</arg_value>{nl}"
                    for k, v in args.items())
    return f"<tool_call>{name}{nl}{pairs}</tool_call>"


class GlmParser(ToolCallParser):
    name = "glm45"
    markers = ("<tool_call>",)
    default_reasoning = THINK

    def find_calls(self, text: str, tools: Sequence[dict[str, Any]] | None = None) -> list[ParsedCall]:
        schemas = tool_schemas(tools)
        out = []
        for m in _CALL.finditer(text):
            body = m.group(1)
            at = body.find("<arg_key>")
            name = (body if at < 0 else body[:at]).strip()
            if not name or "<" in name or "\n" in name:
                continue
            rest = body[len(body) if at < 0 else at:]
            if _PAIR.sub("", rest).strip():
                continue  # stray text between the pairs: not a call
            out.append(typed_call(m.start(), m.end(), name, _PAIR.findall(rest), schemas))
        return out
