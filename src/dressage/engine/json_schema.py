"""``json_schema`` constrained decoding for the built-in engine: a reply that is a JSON document
of the schema, drawn from the seeded generator.

The subset covers what clients send for structured output (pydantic / OpenAI ``strict`` schemas):
``type`` (or a list of types), ``properties`` / ``required`` / ``additionalProperties``, ``items``
with ``minItems`` / ``maxItems``, ``enum``, ``const``, ``anyOf``, local ``$ref`` into ``$defs`` /
``definitions``, string ``minLength`` / ``maxLength``, numeric ``minimum`` / ``maximum``.
Any other constraint keyword is refused (400) by :func:`check_schema`: honouring only part of a
schema would answer documents that break it.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from dressage.errors import EngineRequestError

__all__ = ["parse_schema", "check_schema", "sample_json"]

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment",
                          "strict", "$defs", "definitions", "deprecated", "readOnly", "writeOnly"})
_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
                       "enum", "const", "anyOf", "$ref", "minLength", "maxLength", "minimum", "maximum"})
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_WORDS = ("alpha", "beta", "gamma", "delta", "value", "answer", "result", "item", "name", "step", "token",
          "model", "reward", "plan", "check", "data", "note", "query", "list", "state")


def _bad(msg: str) -> EngineRequestError:
    return EngineRequestError(f"sampling_params.json_schema: {msg}", status_code=400)


def parse_schema(raw: Any) -> dict[str, Any]:
    """The schema of SGLang's ``json_schema`` sampling parameter (a JSON string), checked."""
    if not isinstance(raw, str):
        raise _bad(f"must be a JSON string, got {type(raw).__name__}")
    try:
        schema = json.loads(raw)
    except ValueError as exc:
        raise _bad(f"not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise _bad("must be a JSON object")
    check_schema(schema, schema)
    return schema


def _resolve(ref: Any, root: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise _bad(f"only local $ref (#/$defs/...) is supported, got {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        raise _bad(f"$ref {ref!r} points at nothing")
    return node


def check_schema(schema: Any, root: dict[str, Any], path: str = "#", depth: int = 0) -> None:
    """Raise a 400 for a schema (node) this engine cannot honour whole."""
    if depth > 32:
        raise _bad(f"{path}: nested too deep (recursive $ref?)")
    if schema is True or schema == {}:
        return
    if not isinstance(schema, dict):
        raise _bad(f"{path}: a schema must be an object")
    unknown = sorted(set(schema) - _KEYWORDS - _ANNOTATIONS)
    if unknown:
        raise _bad(f"{path}: keyword(s) {', '.join(unknown)} not supported by this engine")
    types = schema.get("type")
    for t in types if isinstance(types, list) else [types] if types is not None else []:
        if t not in _TYPES:
            raise _bad(f"{path}: unknown type {t!r}")
    if "$ref" in schema:
        check_schema(_resolve(schema["$ref"], root), root, schema["$ref"], depth + 1)
    for key, sub in (schema.get("properties") or {}).items():
        check_schema(sub, root, f"{path}/properties/{key}", depth + 1)
    if isinstance(schema.get("items"), dict):
        check_schema(schema["items"], root, f"{path}/items", depth + 1)
    if isinstance(schema.get("additionalProperties"), dict):
        check_schema(schema["additionalProperties"], root, f"{path}/additionalProperties", depth + 1)
    for i, sub in enumerate(schema.get("anyOf") or []):
        check_schema(sub, root, f"{path}/anyOf/{i}", depth + 1)
    if "enum" in schema and (not isinstance(schema["enum"], list) or not schema["enum"]):
        raise _bad(f"{path}: enum must be a non-empty list")


def _string(rng: np.random.Generator, schema: dict[str, Any]) -> str:
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    text = " ".join(_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), size=int(rng.integers(1, 4))))
    while len(text) < low:
        text += " " + _WORDS[int(rng.integers(len(_WORDS)))]
    return text if high is None else text[:int(high)]


def _number(rng: np.random.Generator, schema: dict[str, Any], integer: bool) -> int | float:
    low = schema.get("minimum", 0)
    high = schema.get("maximum", max(low, 0) + 100)
    if integer:
        return int(rng.integers(int(np.ceil(low)), int(np.floor(high)) + 1))
    return round(float(low + rng.random() * (high - low)), 3)


def sample_json(rng: np.random.Generator, schema: Any, root: dict[str, Any], depth: int = 0) -> Any:
    """A value that satisfies ``schema`` (checked by :func:`check_schema` first)."""
    if schema is True or schema == {} or not isinstance(schema, dict):
        return _WORDS[int(rng.integers(len(_WORDS)))]
    if "$ref" in schema:
        return sample_json(rng, _resolve(schema["$ref"], root), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][int(rng.integers(len(schema["enum"])))]
    if schema.get("anyOf"):
        return sample_json(rng, schema["anyOf"][0], root, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        out = {k: sample_json(rng, sub, root, depth + 1) for k, sub in props.items()
               if k in required or rng.random() < 0.5}
        if not props and schema.get("additionalProperties") is not False:
            extra = schema.get("additionalProperties")
            out[_WORDS[int(rng.integers(len(_WORDS)))]] = sample_json(
                rng, extra if isinstance(extra, dict) else {"type": "string"}, root, depth + 1)
        return out
    if kind == "array":
        low = int(schema.get("minItems", 1 if depth < 4 else 0))
        high = int(schema.get("maxItems", max(low, 3)))
        return [sample_json(rng, schema.get("items", {"type": "string"}), root, depth + 1)
                for _ in range(int(rng.integers(low, high + 1)) if depth < 6 else low)]
    if kind == "integer":
        return _number(rng, schema, True)
    if kind == "number":
        return _number(rng, schema, False)
    if kind == "boolean":
        return bool(rng.random() < 0.5)
    if kind == "null":
        return None
    return _string(rng, schema)
