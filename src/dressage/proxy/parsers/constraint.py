"""``tool_choice`` as an engine constraint: an EBNF grammar of the family's own call syntax.

A forced call (chat ``"required"`` or a named function, Anthropic ``any`` or ``tool``) becomes
SGLang's ``ebnf`` sampling parameter, so every reply is a call the family's parser reads, with
arguments valid for the tool's JSON schema. The grammar is of the model's own syntax (not a JSON
array of calls) so that the tokens recorded for training are the ones the model writes unforced.
Reasoning is not part of the grammar: a forced reply is the call alone.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from dressage.errors import UnsupportedParameterError

__all__ = ["tool_call_constraint", "forced_tool", "json_schema_grammar"]

_FORMATS = {
    # family -> (calls opener, one call's text around NAME and ARGS, separator, closer, argument form)
    "qwen": ("", '"<tool_call>\\n{\\"name\\": \\"{NAME}\\", \\"arguments\\": " {ARGS} "}\\n</tool_call>"', '"\\n"', "",
             "json"),
    "qwen3_coder": ("", '"<tool_call>\\n<function={NAME}>\\n" {ARGS} "</function>\\n</tool_call>"', '"\\n"', "", "xml"),
    "glm45": ("", '"<tool_call>{NAME}\\n" {ARGS} "</tool_call>"', "", "", "glm"),
    "glm47": ("", '"<tool_call>{NAME}" {ARGS} "</tool_call>"', "", "", "glm47"),
    "deepseekv3": ('"<｜tool▁calls▁begin｜>"',
                   '"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{NAME}\\n```json\\n" {ARGS} "\\n```<｜tool▁call▁end｜>"',
                   "", '"<｜tool▁calls▁end｜>"', "json"),
    "deepseekv31": ('"<｜tool▁calls▁begin｜>"', '"<｜tool▁call▁begin｜>{NAME}<｜tool▁sep｜>" {ARGS} "<｜tool▁call▁end｜>"',
                    "", '"<｜tool▁calls▁end｜>"', "json"),
    "kimi_k2": ('"<|tool_calls_section_begin|>"',
                '"<|tool_call_begin|>functions.{NAME}:" [0-9] "<|tool_call_argument_begin|>" {ARGS} "<|tool_call_end|>"',
                "", '"<|tool_calls_section_end|>"', "json"),
    "gpt-oss": ("", '"<|channel|>commentary to=functions.{NAME} <|constrain|>json<|message|>" {ARGS} "<|call|>"',
                None, "", "json"),
}
_ALIASES = {"qwen25": "qwen", "hermes": "qwen", "glm": "glm45", "deepseekv32": "deepseekv31"}


def forced_tool(tool_choice: Any) -> tuple[bool, str | None]:
    """(a call is forced, the one function it must call or ``None``) of an OpenAI chat or Anthropic
    Messages ``tool_choice``."""
    if tool_choice in ("required", "any"):
        return True, None
    if isinstance(tool_choice, dict):
        kind = tool_choice.get("type")
        if kind in ("required", "any"):
            return True, None
        if kind == "function" and isinstance(tool_choice.get("function"), dict):
            return True, tool_choice["function"].get("name")
        if kind == "tool":
            return True, tool_choice.get("name")
    return False, None


def tool_call_constraint(tools: Sequence[dict[str, Any]] | None, tool_choice: Any, parser: str, *,
                         single_call: bool = False) -> dict[str, str] | None:
    """The ``/generate`` sampling parameters that force ``tool_choice`` in the syntax of the
    tool-call parser ``parser`` (``{"ebnf": grammar}``), ``None`` when nothing is forced.

    ``tools`` are OpenAI (``{"type": "function", "function": {...}}``), bare function or Anthropic
    (``{"name", "input_schema"}``) specs; ``single_call`` (``parallel_tool_calls: false``,
    Anthropic's ``disable_parallel_tool_use``) allows exactly one call. Raises
    :class:`UnsupportedParameterError` (``tool_choice``) for a name not in ``tools``.
    """
    forced, name = forced_tool(tool_choice)
    if not forced:
        return None
    specs = _functions(tools)
    if name is not None:
        if name not in specs:
            raise UnsupportedParameterError("tool_choice", f"names function {name!r}, which is not in tools")
        specs = {name: specs[name]}
    if not specs:
        raise UnsupportedParameterError("tool_choice", "forcing a call needs tools")
    family = _ALIASES.get(parser, parser)
    if family not in _FORMATS:
        raise UnsupportedParameterError("tool_choice", f"no call grammar for the {parser!r} tool-call parser")
    opener, call, sep, closer, form = _FORMATS[family]
    rules: list[str] = []
    alts = []
    for i, (fn, schema) in enumerate(specs.items()):
        args = _arguments(schema, form, f"f{i}", rules)
        rules.append(f"call{i} ::= " + call.replace("{NAME}", _lit(fn)[1:-1]).replace("{ARGS}", args))
        alts.append(f"call{i}")
    body = "call" if single_call or sep is None else (f"call ({sep} call)*" if sep else "call+")
    root = " ".join(p for p in (opener, body, closer) if p)
    grammar = "\n".join([f"root ::= {root}", "call ::= " + " | ".join(alts), *rules, *_JSON_RULES])
    return {"ebnf": grammar}


def _functions(tools: Sequence[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            schema = fn.get("parameters", fn.get("input_schema"))
            out[fn["name"]] = schema if isinstance(schema, dict) else {"type": "object", "properties": {}}
    return out


def _lit(text: str) -> str:
    """An EBNF string literal of ``text``."""
    return json.dumps(text, ensure_ascii=False)


_JSON_RULES = [
    'string ::= "\\"" char* "\\""',
    'char ::= [^"\\\\\\x00-\\x1f] | "\\\\" ["\\\\/bfnrt]',
    'integer ::= "-"? ("0" | [1-9] [0-9]*)',
    'number ::= integer ("." [0-9]+)?',
    'boolean ::= "true" | "false"',
    'null ::= "null"',
    'value ::= object | array | string | number | boolean | null',
    'object ::= "{" (string ": " value (", " string ": " value)*)? "}"',
    'array ::= "[" (value (", " value)*)? "]"',
    'rawtext ::= [^<\\n]+',
]


def json_schema_grammar(schema: Any, name: str, rules: list[str], depth: int = 0) -> str:
    """The EBNF expression of a JSON text valid for ``schema`` (new rules appended to ``rules``).

    Covers ``type`` (or a list), ``properties`` (required ones always, in order; optional ones
    may be left out), ``items``, ``enum``, ``const`` and ``anyOf`` / ``oneOf``; any other
    constraint leaves the value free within its type.
    """
    if not isinstance(schema, dict) or depth > 16:
        return "value"
    if "const" in schema:
        return _lit(json.dumps(schema["const"]))
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "(" + " | ".join(_lit(json.dumps(v)) for v in schema["enum"]) + ")"
    subs = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(subs, list) and subs:
        return "(" + " | ".join(json_schema_grammar(s, f"{name}a{i}", rules, depth + 1)
                                for i, s in enumerate(subs)) + ")"
    kind = schema.get("type", "object" if "properties" in schema else None)
    if isinstance(kind, list):
        return "(" + " | ".join(json_schema_grammar({**schema, "type": k}, f"{name}t{i}", rules, depth + 1)
                                for i, k in enumerate(kind)) + ")"
    if kind == "object":
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            return "object"
        required = [k for k in props if k in _required(schema)]
        parts = []
        for i, (key, sub) in enumerate(props.items()):
            rule = f"{name}p{i}"
            rules.append(f"{rule} ::= {_lit(json.dumps(key) + ': ')} {json_schema_grammar(sub, rule, rules, depth + 1)}")
            parts.append((rule, key in required))
        # Required members in order; an optional one may be left out. A comma goes before every
        # member but the first present one, so the rule tracks whether one was written yet.
        seq = _members(parts, name, rules)
        return f'"{{" {seq} "}}"'
    if kind == "array":
        item = json_schema_grammar(schema.get("items"), f"{name}i", rules, depth + 1)
        return f'"[" ({item} (", " {item})*)? "]"' if not schema.get("minItems") else f'"[" {item} (", " {item})* "]"'
    return {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean",
            "null": "null"}.get(kind, "value")


def _required(schema: dict[str, Any]) -> set[str]:
    """The property names ``required`` lists; a ``required`` that is no list of names constrains nothing, as
    any other keyword this grammar does not read."""
    names = schema.get("required")
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


def _members(parts: list[tuple[str, bool]], name: str, rules: list[str]) -> str:
    """Object members in order, optional ones omissible, joined by commas.

    ``{name}m{i}``: members ``i..`` when none was written before; ``{name}r{i}``: when one was.
    """
    n = len(parts)
    for i in range(n - 1, -1, -1):
        rule, req = parts[i]
        if i == n - 1:
            rules.append(f"{name}m{i} ::= {rule}" + ("" if req else "?"))
            rules.append(f'{name}r{i} ::= ' + (f'", " {rule}' if req else f'(", " {rule})?'))
            continue
        rules.append(f"{name}m{i} ::= {rule} {name}r{i + 1}" + ("" if req else f" | {name}m{i + 1}"))
        rules.append(f'{name}r{i} ::= ", " {rule} {name}r{i + 1}' + ("" if req else f" | {name}r{i + 1}"))
    return f"{name}m0"


def _arguments(schema: dict[str, Any], form: str, name: str, rules: list[str]) -> str:
    if form == "json":
        return json_schema_grammar(schema, name, rules)
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = _required(schema)
    parts = []
    for i, (key, sub) in enumerate(props.items()):
        value = _text_value(sub, f"{name}v{i}", rules)
        if form == "xml":
            text = f'{_lit(f"<parameter={key}>" + chr(10))} {value} {_lit(chr(10) + "</parameter>" + chr(10))}'
        else:  # GLM-4.5 / 4.6 write a newline after each tag pair, GLM-4.7 none
            nl = chr(10) if form == "glm" else ""
            text = f'{_lit(f"<arg_key>{key}</arg_key>{nl}<arg_value>")} {value} {_lit("</arg_value>" + nl)}'
        rule = f"{name}x{i}"
        rules.append(f"{rule} ::= {text}")
        parts.append(rule if key in required else f"{rule}?")
    return "(" + " ".join(parts) + ")" if parts else ""


def _text_value(schema: Any, name: str, rules: list[str]) -> str:
    """A parameter value as the XML and GLM templates write it: strings raw, the rest as JSON."""
    if not isinstance(schema, dict):
        return "value"
    if "const" in schema:
        v = schema["const"]
        return _lit(v if isinstance(v, str) else json.dumps(v))
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "(" + " | ".join(_lit(v if isinstance(v, str) else json.dumps(v)) for v in schema["enum"]) + ")"
    subs = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(subs, list) and subs:
        return "(" + " | ".join(_text_value(s, f"{name}a{i}", rules) for i, s in enumerate(subs)) + ")"
    kind = schema.get("type")
    if isinstance(kind, list):
        return "(" + " | ".join(_text_value({**schema, "type": k}, f"{name}t{i}", rules)
                                for i, k in enumerate(kind)) + ")"
    if kind == "string":
        return "rawtext"
    return json_schema_grammar(schema, name, rules)
