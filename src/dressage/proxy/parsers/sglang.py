"""The ``sglang`` backend: whole replies parsed by the engine (SGLang's ``/parse_function_call`` and
``/separate_reasoning``), and the answers of those two endpoints made with this package's parsers.

:class:`EngineParser` is a :class:`ToolCallParser` whose event-loop parse asks the engine; what it
streams, and a parse off the loop, are the local family's of the same name. :class:`ParseEndpoints`
is what the built-in engine answers those endpoints with (the engine is handed it, it imports no Proxy code).
"""

from __future__ import annotations

from typing import Any, Sequence

from dressage.errors import EngineRequestError
from dressage.proxy.parsers.base import ParsedCall, ToolCallParser
from dressage.proxy.parsers.registry import REASONING_PARSERS, TOOL_CALL_PARSERS, make_parser, reasoning_parser

__all__ = ["EngineParser", "ParseEndpoints"]


class EngineParser(ToolCallParser):
    """``local``'s family, parsed by the engine behind ``client`` (an SGLangClient)."""

    def __init__(self, local: ToolCallParser, client: Any, reasoning_name: str) -> None:
        super().__init__(local.reasoning)
        self.local, self.client, self.reasoning_name = local, client, reasoning_name
        self.name, self.markers, self.special_markers = local.name, local.markers, local.special_markers

    def find_calls(self, text: str, tools: Sequence[dict[str, Any]] | None = None) -> list[ParsedCall]:
        return self.local.find_calls(text, tools)

    def parse(self, text: str, *, call_id_prefix: str,
              tools: Sequence[dict[str, Any]] | None = None) -> tuple[str | None, str | None, list[dict[str, Any]]]:
        return self.local.parse(text, call_id_prefix=call_id_prefix, tools=tools)

    def split_reasoning(self, text: str) -> tuple[str, str | None]:
        return self.local.split_reasoning(text)

    def stream_prefix(self, text: str) -> tuple[str | None, str]:
        return self.local.stream_prefix(text)

    def stream_calls(self, text: str, *, call_id_prefix: str,
                     tools: Sequence[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        return []  # the engine's parse decides the calls: they are sent once it answered

    async def asplit_reasoning(self, text: str) -> tuple[str, str | None]:
        out = await self.client.separate_reasoning(text, self.reasoning_name)
        return out["text"], out.get("reasoning_text")

    async def aparse(self, text: str, *, call_id_prefix: str, tools: Sequence[dict[str, Any]] | None = None
                     ) -> tuple[str | None, str | None, list[dict[str, Any]]]:
        content, reasoning = await self.asplit_reasoning(text)
        # A family whose reasoning is part of its own markup (harmony) is read whole.
        out = await self.client.parse_function_call(content if self.local.reasoning is not None else text,
                                                    self.name, list(tools or ()))
        calls = [{"id": c.get("id") or f"{call_id_prefix}_{i}", "type": "function",
                  "function": {"name": c["name"], "arguments": c["parameters"]}}
                 for i, c in enumerate(out["calls"]) if isinstance(c, dict) and c.get("name")]
        normal = out["normal_text"]
        if not calls:
            return (normal if self.local.reasoning is not None else content), reasoning, []
        return normal.strip() or None, reasoning, calls


class ParseEndpoints:
    """The built-in engine's ``/parse_function_call`` and ``/separate_reasoning`` answers, in SGLang's shapes."""

    def parse_function_call(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            raise EngineRequestError("text must be a string", status_code=400)
        name, tools = body.get("tool_call_parser"), body.get("tools") or []
        if name not in TOOL_CALL_PARSERS:
            raise EngineRequestError(f"tool_call_parser: unknown parser {name!r}", status_code=400)
        if not isinstance(tools, list):
            raise EngineRequestError("tools must be a list", status_code=400)
        content, _, calls = make_parser(name, "none").parse(body["text"], call_id_prefix="call", tools=tools)
        names = [((t.get("function") or {}).get("name") if isinstance(t, dict) else None) for t in tools]
        out = []
        for c in calls:
            fn = c["function"]
            entry = {"tool_index": names.index(fn["name"]) if fn["name"] in names else -1,
                     "name": fn["name"], "parameters": fn["arguments"]}
            if not c["id"].startswith("call_"):
                entry["id"] = c["id"]  # the model's own id (Kimi-K2); not in SGLang's answer
            out.append(entry)
        return {"normal_text": content or "", "calls": out}

    def separate_reasoning(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            raise EngineRequestError("text must be a string", status_code=400)
        name = body.get("reasoning_parser")
        if name not in REASONING_PARSERS:
            raise EngineRequestError(f"reasoning_parser: unknown parser {name!r}", status_code=400)
        reasoning = reasoning_parser(name)
        if reasoning is None and name in TOOL_CALL_PARSERS:  # reasoning inside the family's markup (harmony)
            text, thought = make_parser(name).split_reasoning(body["text"])
        elif reasoning is None:
            text, thought = body["text"], None
        else:
            thought, text = reasoning.split(body["text"])
            text = text if thought is not None else body["text"]
        return {"text": text, "reasoning_text": thought}
