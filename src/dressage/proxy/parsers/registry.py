"""Parsers by name, and the default pair for a served model's name.

Names are SGLang's ``--tool-call-parser`` / ``--reasoning-parser`` names, so that a delegated
parse (:mod:`dressage.proxy.parsers.sglang`) asks the engine for the same family.

==============================================  =================  =================
served model name contains                      tool-call parser   reasoning parser
==============================================  =================  =================
qwen3-coder, qwen3.5, qwen3.6 (qwen3_5, ...)    ``qwen3_coder``    ``qwen3``
qwen3, qwen2.5, qwq                             ``qwen``           ``qwen3``
glm-4.5, glm-4.6                                ``glm45``          ``glm45``
glm-4.7, glm-5                                  ``glm47``          ``glm45``
deepseek-v3.1, deepseek-v3.2                    ``deepseekv31``    ``deepseek-v3``
deepseek-r1, deepseek-v3                        ``deepseekv3``     ``deepseek-r1``
kimi-k2                                         ``kimi_k2``        ``kimi_k2``
gpt-oss                                         ``gpt-oss``        ``gpt-oss``
anything else                                   ``qwen``           ``qwen3``
==============================================  =================  =================
"""

from __future__ import annotations

import re

from dressage.errors import ConfigError
from dressage.proxy.parsers.base import ReasoningParser, ToolCallParser
from dressage.proxy.parsers.deepseek import DeepSeekV3Parser, DeepSeekV31Parser
from dressage.proxy.parsers.glm import GlmParser
from dressage.proxy.parsers.harmony import HarmonyParser
from dressage.proxy.parsers.hermes import HermesParser
from dressage.proxy.parsers.kimi import KimiK2Parser
from dressage.proxy.parsers.qwen_xml import QwenXmlParser

__all__ = ["TOOL_CALL_PARSERS", "REASONING_PARSERS", "MODEL_DEFAULTS", "make_parser", "reasoning_parser",
           "default_parsers", "resolve", "AUTO"]

AUTO = "auto"
"""The parser setting that picks the family from the served model's name (:func:`default_parsers`)."""

TOOL_CALL_PARSERS: dict[str, type[ToolCallParser]] = {
    "qwen": HermesParser, "qwen25": HermesParser, "hermes": HermesParser,
    "qwen3_coder": QwenXmlParser,
    "glm45": GlmParser, "glm": GlmParser, "glm47": GlmParser,
    "deepseekv3": DeepSeekV3Parser, "deepseekv31": DeepSeekV31Parser, "deepseekv32": DeepSeekV31Parser,
    "kimi_k2": KimiK2Parser,
    "gpt-oss": HarmonyParser,
}
"""``--tool-call-parser`` names (SGLang's, aliases included) -> family."""

REASONING_PARSERS: dict[str, tuple[str, str, bool] | None] = {
    "qwen3": ("<think>", "</think>", False), "qwen3-thinking": ("<think>", "</think>", True),
    "glm45": ("<think>", "</think>", False),
    "deepseek-r1": ("<think>", "</think>", True), "deepseek-v3": ("<think>", "</think>", True),
    "kimi": ("◁think▷", "◁/think▷", False), "kimi_k2": ("<think>", "</think>", False),
    "gpt-oss": None, "none": None,
}
"""``--reasoning-parser`` names -> (start, end, implicit_open); ``None``: the family has no block of
its own (gpt-oss reasons in its analysis channel, which its tool-call parser reads)."""

MODEL_DEFAULTS: tuple[tuple[str, str, str], ...] = (
    (r"qwen3[-_.]?coder|qwen3[._-]?[56]", "qwen3_coder", "qwen3"),
    (r"qwen3|qwen2[._-]?5|qwq", "qwen", "qwen3"),
    (r"glm[-_]?(4[._-]?7|5)", "glm47", "glm45"),
    (r"glm[-_]?4[._-]?[56]", "glm45", "glm45"),
    (r"deepseek[-_]?v3[._-]?[12]", "deepseekv31", "deepseek-v3"),
    (r"deepseek[-_]?(r1|v3)", "deepseekv3", "deepseek-r1"),
    (r"kimi[-_]?k2", "kimi_k2", "kimi_k2"),
    (r"gpt[-_]?oss", "gpt-oss", "gpt-oss"),
)
"""(pattern searched in the lower-cased model name, tool-call parser, reasoning parser), first match wins."""

DEFAULT = ("qwen", "qwen3")


def default_parsers(*model_names: str | None) -> tuple[str, str]:
    """(tool-call parser, reasoning parser) for the first of ``model_names`` the table knows
    (the engine's ``model_path`` first, then ``--model``), else Hermes JSON with ``<think>``."""
    for name in model_names:
        if not name:
            continue
        low = str(name).lower()
        for pattern, tool, reasoning in MODEL_DEFAULTS:
            if re.search(pattern, low):
                return tool, reasoning
    return DEFAULT


def resolve(tool_call_parser: str, reasoning: str, *model_names: str | None) -> tuple[str, str]:
    """The settings with ``auto`` replaced by :func:`default_parsers` of ``model_names``."""
    tool, think = default_parsers(*model_names)
    return (tool if tool_call_parser == AUTO else tool_call_parser), (think if reasoning == AUTO else reasoning)


def reasoning_parser(name: str) -> ReasoningParser | None:
    """The reasoning parser ``name`` (``None`` for a family without a block of its own)."""
    if name not in REASONING_PARSERS:
        raise ConfigError(f"reasoning parser {name!r} is unknown; known: {', '.join(sorted(REASONING_PARSERS))}")
    spec = REASONING_PARSERS[name]
    if spec is None:
        return None
    start, end, implicit = spec
    return ReasoningParser(name, start, end, implicit_open=implicit)


def make_parser(tool_call_parser: str, reasoning: str | None = None) -> ToolCallParser:
    """The family ``tool_call_parser`` composed with the reasoning parser ``reasoning`` (``None``:
    the family's own, ``<think>`` blocks for all but gpt-oss)."""
    family = TOOL_CALL_PARSERS.get(tool_call_parser)
    if family is None:
        raise ConfigError(f"tool-call parser {tool_call_parser!r} is unknown; "
                          f"known: {', '.join(sorted(TOOL_CALL_PARSERS))}")
    parser = family() if reasoning is None else family(reasoning_parser(reasoning))
    parser.name = tool_call_parser
    return parser
