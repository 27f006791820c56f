"""A ChatML chat template in the style of Qwen's: messages (and tools) to one prompt string.

Turns are ``<|im_start|>role\\n...<|im_end|>\\n``; tools are listed in the system turn as JSON
lines inside ``<tools>``; assistant tool calls are ``<tool_call>{json}</tool_call>`` blocks and tool
results go back in a user turn as ``<tool_response>`` blocks (consecutive results share one turn).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from dressage.errors import ChatTemplateError
from dressage.tokenizer.base import Message, Tokenizer, ToolSpec

__all__ = [
    "IM_START", "IM_END", "ENDOFTEXT", "TOOLS_OPEN", "TOOLS_CLOSE", "TOOL_CALL_OPEN", "TOOL_CALL_CLOSE",
    "TOOL_RESPONSE_OPEN", "TOOL_RESPONSE_CLOSE",
    "render_chatml", "message_text", "tool_call_json", "ChatMLTokenizer",
]

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
TOOLS_OPEN, TOOLS_CLOSE = "<tools>", "</tools>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

_ROLES = ("system", "user", "assistant", "tool")

_TOOLS_PREAMBLE = (
    "# Tools\n\n"
    "You can call the functions below to help with the user's request.\n"
    "Their signatures, one JSON object per line:\n"
)
_TOOLS_CALL_HINT = (
    "\n\nTo call a function, reply with a JSON object holding its name and arguments "
    "between tool-call tags:\n"
    f"{TOOL_CALL_OPEN}\n" '{"name": <function-name>, "arguments": <arguments-object>}' f"\n{TOOL_CALL_CLOSE}"
)


def message_text(message: Message, index: int) -> str:
    """The text of a message's ``content``: a string, ``None``, or a list of text parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise ChatTemplateError(f"messages[{index}].content[{j}]: only text parts are supported")
        return "".join(parts)
    raise ChatTemplateError(f"messages[{index}].content must be a string, a list of parts or null")


def tool_call_json(call: Any, index: int) -> str:
    """One OpenAI ``tool_calls`` entry as the template's ``{"name", "arguments"}`` JSON."""
    fn = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ChatTemplateError(f"messages[{index}].tool_calls: each call needs function.name")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        # OpenAI sends arguments as a JSON string; the template shows the object itself.
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            raise ChatTemplateError(f"messages[{index}].tool_calls: arguments are not JSON: {exc}") from exc
    return json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False)


def _tools_block(tools: Sequence[ToolSpec]) -> str:
    lines = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ChatTemplateError(f"tools[{i}] must be an object")
        lines.append(json.dumps(tool, ensure_ascii=False))
    return _TOOLS_PREAMBLE + TOOLS_OPEN + "\n" + "\n".join(lines) + "\n" + TOOLS_CLOSE + _TOOLS_CALL_HINT


def render_chatml(messages: Sequence[Message], tools: Sequence[ToolSpec] | None = None,
                  add_generation_prompt: bool = True) -> str:
    """The prompt string for ``messages``; see the module docstring for the layout."""
    out: list[str] = []
    msgs = list(messages)
    start = 0
    if tools:
        system = ""
        if msgs and isinstance(msgs[0], dict) and msgs[0].get("role") == "system":
            system = message_text(msgs[0], 0) + "\n\n"
            start = 1
        out.append(f"{IM_START}system\n{system}{_tools_block(tools)}{IM_END}\n")
    for i in range(start, len(msgs)):
        m = msgs[i]
        role = m.get("role") if isinstance(m, dict) else None
        if role not in _ROLES:
            raise ChatTemplateError(f"messages[{i}].role must be one of {', '.join(_ROLES)}, got {role!r}")
        text = message_text(m, i)
        if role == "tool":
            prev_tool = i > start and msgs[i - 1].get("role") == "tool"
            next_tool = i + 1 < len(msgs) and msgs[i + 1].get("role") == "tool"
            out.append(f"{IM_START}user" if not prev_tool else "")
            out.append(f"\n{TOOL_RESPONSE_OPEN}\n{text}\n{TOOL_RESPONSE_CLOSE}")
            out.append(f"{IM_END}\n" if not next_tool else "")
        elif role == "assistant":
            body = text
            for call in m.get("tool_calls") or ():
                sep = "\n" if body else ""
                body += f"{sep}{TOOL_CALL_OPEN}\n{tool_call_json(call, i)}\n{TOOL_CALL_CLOSE}"
            out.append(f"{IM_START}assistant\n{body}{IM_END}\n")
        else:
            out.append(f"{IM_START}{role}\n{text}{IM_END}\n")
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
    return "".join(out)


class ChatMLTokenizer(Tokenizer):
    """A backend whose control tokens are ChatML's and whose prompts this module renders.

    Subclasses fill ``_specials`` (control token string -> id) and implement encode / decode /
    ``vocab_size``; the special ids and the chat template come from here.
    """

    _specials: dict[str, int]

    @property
    def eos_token_id(self) -> int:
        return self._specials[ENDOFTEXT]

    @property
    def im_start_token_id(self) -> int:
        return self._specials[IM_START]

    @property
    def im_end_token_id(self) -> int:
        return self._specials[IM_END]

    def apply_chat_template(self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None = None,
                            add_generation_prompt: bool = True) -> list[int]:
        return self.encode(render_chatml(messages, tools, add_generation_prompt))

    def render_text(self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None = None,
                    add_generation_prompt: bool = True) -> str:
        return render_chatml(messages, tools, add_generation_prompt)
