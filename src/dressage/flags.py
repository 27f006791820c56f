"""Command-line flags generated from config dataclasses, so every default is declared once.

A field becomes ``--field-name`` (or the ``flag`` its metadata names); its help is the field's
docstring with the default shown. ``bool`` fields are switches, ``tuple[str, ...]`` take one or
more values, ``X | None`` take an ``X``. Metadata made by :func:`flag` adds choices, a metavar,
a parser for the text (``parse``), ``append`` for a repeated flag, ``aliases`` (other names of the
same flag), or ``skip``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import sys
import types
import typing
from functools import lru_cache
from typing import Any, Callable

__all__ = ["flag", "add_flags", "from_flags", "field_docs"]


def flag(name: str | None = None, *, choices: Any = None, metavar: str | None = None,
         parse: Callable[[str], Any] | None = None, append: bool = False, required: bool = False,
         skip: bool = False, default_text: Any = None, aliases: tuple[str, ...] = ()) -> dict[str, Any]:
    """Field metadata for :func:`add_flags`."""
    return {"flag": {"name": name, "choices": choices, "metavar": metavar, "parse": parse, "append": append,
                     "required": required, "skip": skip, "default_text": default_text,
                     "aliases": tuple(aliases)}}


@lru_cache(maxsize=None)
def _docs(cls: type) -> dict[str, str]:
    tree = ast.parse(inspect.getsource(sys.modules[cls.__module__]))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            out: dict[str, str] = {}
            body = node.body
            for a, b in zip(body, body[1:]):
                if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr) \
                        and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str):
                    out[a.target.id] = " ".join(b.value.value.split())
            return out
    return {}


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under it), whitespace collapsed."""
    return dict(_docs(cls))


def _meta(f: dataclasses.Field) -> dict[str, Any]:
    return f.metadata.get("flag") or flag()["flag"]


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def _dest(prefix: str, f: dataclasses.Field) -> str:
    return f"{prefix}{f.name}"


def add_flags(parser: Any, cls: type, *, prefix: str = "", defaults: dict[str, Any] | None = None) -> None:
    """Add one flag per field of ``cls`` to ``parser`` (a parser or an argument group).

    ``defaults`` overrides a field's default for this command; values land under ``prefix + name``.
    """
    hints = typing.get_type_hints(cls)
    docs = _docs(cls)
    for f in dataclasses.fields(cls):
        meta = _meta(f)
        hint = hints[f.name]
        if meta["skip"] or hint is Any or (dataclasses.is_dataclass(hint) and "flag" not in f.metadata):
            continue  # nested configs add their own flags; a dataclass value with a flag() is named by text
        name = meta["name"] or "--" + f.name.replace("_", "-")
        default = (defaults or {}).get(f.name, _default(f))
        shown = meta["default_text"] if meta["default_text"] is not None else default
        help_ = docs.get(f.name, "")
        if not meta["required"] and not isinstance(default, bool) and shown not in (None, (), []):
            help_ += f" (default: {shown})"
        kw: dict[str, Any] = {"dest": _dest(prefix, f), "help": help_.replace("%", "%%")}
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        base = args[0] if args and typing.get_origin(hint) in (typing.Union, types.UnionType) else hint
        if base is bool:
            kw.update(action="store_true", default=default)
        else:
            if typing.get_origin(base) is tuple or meta["append"]:
                if meta["append"]:
                    kw["action"] = "append"
                else:
                    kw["nargs"] = "+"
                item = (typing.get_args(base) or (str,))[0]
                kw["type"] = meta["parse"] or item
                default = None if meta["append"] else default
            else:
                kw["type"] = meta["parse"] or (base if base in (int, float, str) else str)
            kw["default"] = default
            for key in ("choices", "metavar", "required"):
                if meta[key]:
                    kw[key] = meta[key]
        parser.add_argument(name, *meta.get("aliases", ()), **kw)


def from_flags(cls: type, args: argparse.Namespace, *, prefix: str = "", **extra: Any) -> Any:
    """Build ``cls`` from what :func:`add_flags` parsed (``extra`` fills or overrides fields)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if _meta(f)["skip"] or not hasattr(args, _dest(prefix, f)):
            continue
        value = getattr(args, _dest(prefix, f))
        if isinstance(value, list):
            value = tuple(value)
        values[f.name] = value
    values.update(extra)
    return cls(**values)
