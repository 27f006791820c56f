"""The parser seam: a model family's reply text -> content, reasoning and OpenAI ``tool_calls``.

:class:`ToolCallParser` is the interface every endpoint room reads replies through; a family
implements :meth:`ToolCallParser.find_calls` (and its call markers) and composes a
:class:`ReasoningParser` for its reasoning blocks. :func:`assistant_message` is the one place a
reply becomes an assistant message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

__all__ = ["ToolCallParser", "ReasoningParser", "THINK", "ParsedCall", "assistant_message", "read_assistant_message", "tool_schemas",
           "typed_value", "typed_call", "written_value", "call_entry", "held_tail"]


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """One well-formed call found in a reply: where it lies in the text, its name and its arguments."""

    start: int
    end: int
    """``text[start:end]`` is the call's whole markup (a section wrapper around calls is its own span)."""
    name: str
    arguments: str
    """The arguments as a JSON text (OpenAI's ``function.arguments``)."""
    call_id: str | None = None
    """The model's own id for the call, when its format writes one (Kimi-K2's ``functions.NAME:IDX``)."""


def tool_schemas(tools: Sequence[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Each offered function's parameter properties by function name (OpenAI or bare function specs)."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
            props = params.get("properties")
            out[fn["name"]] = props if isinstance(props, dict) else {}
    return out


def _kinds(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind} if isinstance(kind, str) else set()
    for sub in schema.get("anyOf") or schema.get("oneOf") or ():
        kinds |= _kinds(sub)
    return kinds


def typed_value(raw: str, schema: Any) -> Any:
    """A parameter value written as text, read as the type the tool's JSON schema gives it.

    Strings stay raw; integers, numbers, booleans, null, objects and arrays are read as JSON. A
    value that does not read as its type stays the text it is; without a schema, JSON objects and
    arrays are read and anything else stays text.
    """
    kinds = _kinds(schema)
    if "string" in kinds and len(kinds - {"string", "null"}) == 0:
        return raw
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    if not kinds:
        return raw if isinstance(value, (str, int, float, bool)) or value is None else value
    ok = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "boolean": lambda v: isinstance(v, bool), "null": lambda v: v is None,
          "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
          "string": lambda v: isinstance(v, str)}
    return value if any(ok.get(k, lambda v: False)(value) for k in kinds) else raw


def written_value(value: Any) -> str:
    """A parameter value as XML-like call formats write it: strings raw, anything else as JSON (the chat
    templates' ``tojson``); :func:`typed_value` reads it back."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def typed_call(start: int, end: int, name: str, pairs: Iterable[tuple[str, str]],
               schemas: dict[str, dict[str, Any]]) -> ParsedCall:
    """A call whose arguments the model wrote as ``(key, raw value)`` pairs (XML-like formats), each value
    read by :func:`typed_value` against the tool's schema (``schemas`` as :func:`tool_schemas` gives them)."""
    props = schemas.get(name, {})
    args = {key.strip(): typed_value(raw, props.get(key.strip())) for key, raw in pairs}
    return ParsedCall(start, end, name, json.dumps(args, ensure_ascii=False))


def call_entry(call: ParsedCall, call_id: str) -> dict[str, Any]:
    """The OpenAI ``tool_calls[]`` entry of a parsed call."""
    return {"id": call.call_id or call_id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def held_tail(text: str, markers: Sequence[str]) -> str:
    """``text`` without a tail that may still grow into one of ``markers``."""
    hold = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), hold, -1):
            if marker.startswith(text[-k:]):
                hold = k
                break
    return text[:len(text) - hold] if hold else text


class ReasoningParser:
    """A family's reasoning block: ``start`` ... ``end`` at the head of a reply.

    ``implicit_open``: the chat template opens the block in the prompt, so a reply that holds
    ``end`` without ``start`` reasons up to it (DeepSeek-R1 / V3.1 thinking). ``name`` is the
    parser's registry name (SGLang's ``reasoning_parser`` name).
    """

    def __init__(self, name: str, start: str = "<think>", end: str = "</think>", *,
                 implicit_open: bool = False) -> None:
        self.name, self.start, self.end, self.implicit_open = name, start, end, implicit_open

    def split(self, text: str) -> tuple[str | None, str]:
        """(reasoning, the rest) of a whole reply; reasoning ``None`` when it has no block."""
        head = text.lstrip()
        if head.startswith(self.start):
            close = head.find(self.end, len(self.start))
            if close < 0:
                return None, text  # an unclosed block is not reasoning the template can render back
            return head[len(self.start):close].strip(), head[close + len(self.end):].lstrip()
        if self.implicit_open:
            close = text.find(self.end)
            if close >= 0 and self.start not in text[:close]:
                return text[:close].strip(), text[close + len(self.end):].lstrip()
        return None, text

    def stream_split(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, the rest) certain from a reply's beginning ``text``: the rest is ``None`` while
        the text may still be (or become) a reasoning block."""
        head = text.lstrip()
        if head.startswith(self.start):
            close = head.find(self.end, len(self.start))
            if close < 0:
                return None, None
            return head[len(self.start):close].strip(), head[close + len(self.end):].lstrip()
        if self.start.startswith(head):
            return None, None
        if self.implicit_open:
            close = text.find(self.end)
            if close < 0:
                return None, None
            return self.split(text)
        return None, text


THINK = ReasoningParser("qwen3")
"""``<think>...</think>`` at the head of a reply: the reasoning block of most families."""


class ToolCallParser:
    """Splits a model's reply text into content, reasoning and OpenAI ``tool_calls``.

    A family gives ``name`` (its registry name, SGLang's ``tool_call_parser`` name), ``markers``
    (texts that open a call or a call section: content streams only up to the first) and
    :meth:`find_calls`; ``reasoning`` is the composed :class:`ReasoningParser` (``None``: the family
    writes no reasoning). ``tools`` (the call's offered tools) types parameter values where the
    format writes them as text.
    """

    name = "base"
    markers: tuple[str, ...] = ()
    default_reasoning: ReasoningParser | None = None
    """The reasoning parser a family is made with when none is named."""
    special_markers = False
    """The family's markers are special tokens: reply texts must be decoded with them."""

    def __init__(self, reasoning: Any = ...) -> None:
        # ``...`` (left out): the family's own reasoning parser; ``None``: none.
        self.reasoning: ReasoningParser | None = self.default_reasoning if reasoning is ... else reasoning

    def find_calls(self, text: str, tools: Sequence[dict[str, Any]] | None = None) -> list[ParsedCall]:
        """The well-formed calls in ``text`` (reasoning already split off), in order."""
        raise NotImplementedError

    def split_reasoning(self, text: str) -> tuple[str, str | None]:
        """(content, reasoning) of a reply read without tool calls."""
        if self.reasoning is None:
            return text, None
        reasoning, rest = self.reasoning.split(text)
        return (rest, reasoning) if reasoning is not None else (text, None)

    def parse(self, text: str, *, call_id_prefix: str,
              tools: Sequence[dict[str, Any]] | None = None) -> tuple[str | None, str | None, list[dict[str, Any]]]:
        """(content, reasoning, tool_calls) of a whole reply.

        Text that looks like a call but is not well formed stays in the content; with calls the
        content is the text around them, stripped (``None`` when empty).
        """
        text, reasoning = self.split_reasoning(text)
        found = self.find_calls(text, tools)
        calls = [call_entry(c, f"{call_id_prefix}_{i}") for i, c in enumerate(c for c in found if c.name)]
        if not calls:
            return text, reasoning, []
        kept, pos = [], 0
        for c in found:
            kept.append(text[pos:c.start])
            pos = c.end
        kept.append(text[pos:])
        content = "".join(kept).strip()
        return content or None, reasoning, calls

    async def aparse(self, text: str, *, call_id_prefix: str, tools: Sequence[dict[str, Any]] | None = None
                     ) -> tuple[str | None, str | None, list[dict[str, Any]]]:
        """:meth:`parse` for the event loop (a parser that asks the engine overrides it)."""
        return self.parse(text, call_id_prefix=call_id_prefix, tools=tools)

    async def asplit_reasoning(self, text: str) -> tuple[str, str | None]:
        """:meth:`split_reasoning` for the event loop."""
        return self.split_reasoning(text)

    def stream_calls(self, text: str, *, call_id_prefix: str,
                     tools: Sequence[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The ``tool_calls`` entries that any reply beginning with ``text`` certainly parses to: its
        complete calls, in order, with the ids :meth:`parse` gives them (a call streams once closed)."""
        if self.reasoning is None:
            rest: str | None = text
        else:
            rest = self.reasoning.stream_split(text)[1]
        if rest is None:
            return []
        found = [c for c in self.find_calls(rest, tools) if c.name]
        return [call_entry(c, f"{call_id_prefix}_{i}") for i, c in enumerate(found)]

    def stream_prefix(self, text: str) -> tuple[str | None, str]:
        """(reasoning, content) that any reply beginning with ``text`` certainly parses to.

        ``reasoning`` is ``None`` until its block is closed; ``content`` must be a prefix of the
        final content (up to surrounding whitespace) whatever text follows: it stops before the
        first call marker and holds back a tail that may grow into one. A parser that names no
        markers streams nothing before the reply is complete.
        """
        if not self.markers:
            return None, ""
        reasoning, rest = (None, text) if self.reasoning is None else self.reasoning.stream_split(text)
        if rest is None:
            return None, ""
        cut = min((i for i in (rest.find(m) for m in self.markers) if i >= 0), default=-1)
        rest = rest[:cut] if cut >= 0 else held_tail(rest, self.markers)
        # Trailing blanks may be stripped later; a replacement char may be half a UTF-8 sequence.
        return reasoning, rest.rstrip().rstrip("\ufffd").rstrip()


def _message(content: str | None, reasoning: str | None, calls: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def assistant_message(parser: ToolCallParser, text: str, *, call_id_prefix: str, tool_calls: bool = True,
                      tools: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The OpenAI assistant message of a reply's text (as recorded and as returned to the agent).

    Without ``tool_calls`` (``tool_choice: "none"``) no tool call is parsed: call-like text stays
    in the content.
    """
    if tool_calls:
        return _message(*parser.parse(text, call_id_prefix=call_id_prefix, tools=tools))
    return _message(*parser.split_reasoning(text), [])


async def read_assistant_message(parser: ToolCallParser, text: str, *, call_id_prefix: str, tool_calls: bool = True,
                                 tools: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """:func:`assistant_message` on the event loop: the path the endpoint rooms take (a parser may
    ask the engine)."""
    if tool_calls:
        return _message(*await parser.aparse(text, call_id_prefix=call_id_prefix, tools=tools))
    return _message(*await parser.asplit_reasoning(text), [])
