"""The Proxy's reply parser from its settings: the family by name (or the served model's name),
parsed locally or by the engine."""

from __future__ import annotations

from typing import Any

from dressage.proxy.parsers.base import ToolCallParser
from dressage.proxy.parsers.registry import make_parser, resolve
from dressage.proxy.parsers.sglang import EngineParser

__all__ = ["reply_parser"]


def reply_parser(tool_call_parser: str, reasoning_parser: str, *model_names: str | None,
                 engine: Any = None) -> ToolCallParser:
    """The parser the Proxy's rooms read replies with. ``auto`` settings follow ``model_names``
    (:func:`~dressage.proxy.parsers.registry.default_parsers`); with ``engine`` (an SGLangClient)
    whole replies are parsed by that engine."""
    tool, reasoning = resolve(tool_call_parser, reasoning_parser, *model_names)
    local = make_parser(tool, reasoning)
    return local if engine is None else EngineParser(local, engine, reasoning)
