"""Tool-call and reasoning parsers per model family, and ``tool_choice`` as an engine constraint.

Every endpoint room (chat, Responses, Anthropic Messages) reads replies through
:class:`ToolCallParser` (:func:`assistant_message` builds the OpenAI message) and forces calls
with :func:`tool_call_constraint` (chat and Anthropic ``tool_choice`` alike); :func:`make_parser` /
:func:`default_parsers` pick a family by name.
"""

from dressage.proxy.parsers.base import (ParsedCall, ReasoningParser, ToolCallParser, assistant_message,
                                         read_assistant_message, tool_schemas, typed_value)
from dressage.proxy.parsers.constraint import forced_tool, tool_call_constraint
from dressage.proxy.parsers.factory import reply_parser
from dressage.proxy.parsers.registry import (AUTO, MODEL_DEFAULTS, REASONING_PARSERS, TOOL_CALL_PARSERS,
                                             default_parsers, make_parser, reasoning_parser, resolve)
from dressage.proxy.parsers.sglang import EngineParser, ParseEndpoints

__all__ = ["ToolCallParser", "ReasoningParser", "ParsedCall", "assistant_message", "read_assistant_message",
           "tool_schemas", "typed_value", "make_parser", "reasoning_parser", "default_parsers", "resolve",
           "reply_parser", "EngineParser", "ParseEndpoints", "TOOL_CALL_PARSERS", "REASONING_PARSERS",
           "MODEL_DEFAULTS", "AUTO", "tool_call_constraint", "forced_tool"]
