"""One config tree per command: nested config dataclasses -> command-line flags and YAML, defaults declared once.

A command's root config is a dataclass whose dataclass-typed fields are *sections* (nested as deep as
needed); every other field is a *setting*. :class:`ConfigTree` turns the tree into flags: each setting
gets its dotted name (``--server.port``) and its flat name (``--port``, or the ``name`` its :func:`flag`
metadata gives, plus ``aliases``), its help is the field's docstring with the default shown, and
``--help`` lists one group per section. ``--config FILE`` reads a YAML map of the same tree; flags given
on the command line override it. ``bool`` settings take ``true``/``false`` under their dotted name and
are switches under their flat name; ``tuple[...]`` take one or more values (or a repeated flag with
``append``); ``X | None`` take an ``X``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import os
import re
import sys
import types
import typing
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from dressage.errors import ConfigError

__all__ = ["flag", "field_docs", "ConfigTree", "Setting", "config_to_dict", "parse_bool", "help_text",
           "setting_path", "read_secret_file", "check_writable"]

_DEST = "config:"  # argparse dest prefix of a setting; the dotted path follows
_METAVARS = {int: "N", float: "X"}


def flag(name: str | None = None, *, choices: Any = None, metavar: str | None = None,
         parse: Callable[[str], Any] | None = None, append: bool = False, skip: bool = False,
         default_text: Any = None, aliases: tuple[str, ...] = (), flat: bool = True,
         positional: bool = False, section: type | None = None) -> dict[str, Any]:
    """Field metadata for :class:`ConfigTree`.

    ``name``: the flat flag (default ``--field-name``); ``flat=False``: only the dotted name;
    ``parse``: text -> value; ``skip``: set in code or YAML only; ``positional``: a positional argument.
    A dataclass-typed field with ``flag`` metadata is one setting (given as text), not a section.
    ``section``: the field's value is made from this section class (its fields are the flags); the
    owner resolves what the tree built, and the class's ``of(value)`` gives the section back for YAML.
    """
    return {"flag": {"name": name, "choices": choices, "metavar": metavar, "parse": parse, "append": append,
                     "skip": skip, "default_text": default_text, "aliases": tuple(aliases), "flat": flat,
                     "positional": positional, "section": section}}


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


_LITERAL = re.compile(r"``(.+?)``")
_STATED_DEFAULT = re.compile(r"\(default[:\s]", re.IGNORECASE)


def help_text(doc: str) -> str:
    """A field docstring as ``--help`` prints it: reST literals bare, and ``None`` (a Python value
    the terminal reader never types) as "unset"."""
    return _LITERAL.sub(lambda m: "unset" if m.group(1) == "None" else m.group(1), doc)


def setting_path(dest: str) -> str | None:
    """The dotted setting (its YAML key) an argparse ``dest`` of a :class:`ConfigTree` flag sets; ``None``
    for any other argument."""
    return dest[len(_DEST):] or None if dest.startswith(_DEST) else None


def parse_bool(text: str) -> bool:
    """``true``/``false`` (also yes/no, on/off, 1/0) as a bool."""
    value = {"true": True, "yes": True, "on": True, "1": True,
             "false": False, "no": False, "off": False, "0": False}.get(str(text).strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


def _meta(f: dataclasses.Field) -> dict[str, Any]:
    return f.metadata.get("flag") or flag()["flag"]


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING  # type: ignore[misc]


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def _section_of(f: dataclasses.Field, hint: Any) -> type | None:
    """The section class of a field (``None``: a setting)."""
    if "flag" in f.metadata:
        return f.metadata["flag"]["section"]
    return hint if dataclasses.is_dataclass(hint) else None


def _base(hint: Any) -> Any:
    """``X`` of ``X | None``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


@dataclasses.dataclass(frozen=True, slots=True)
class Setting:
    """One leaf of a config tree: where it sits and the field that declares it."""

    path: str
    """Dotted path from the root (``server.port``)."""
    owner: type
    """The section class that declares the field."""
    field: dataclasses.Field
    hint: Any
    default: Any
    """The default this command uses (the field's, or the tree's override)."""
    required: bool

    @property
    def meta(self) -> dict[str, Any]:
        return _meta(self.field)

    @property
    def dest(self) -> str:
        return _DEST + self.path

    @property
    def is_bool(self) -> bool:
        return _base(self.hint) is bool

    def flat_names(self) -> list[str]:
        meta = self.meta
        names = [meta["name"] or "--" + self.field.name.replace("_", "-")] if meta["flat"] else []
        return names + [a for a in meta["aliases"]]


class ConfigTree:
    """The flags and YAML of one command's root config class.

    ``defaults`` changes a setting's default for this command (``{"server.port": 8000}``); ``omit``
    leaves settings or whole sections out of this command's flags (they keep their defaults).
    """

    def __init__(self, root: type, *, defaults: Mapping[str, Any] | None = None,
                 omit: tuple[str, ...] = (), yaml_flag: str | None = "--config") -> None:
        self.root = root
        self.defaults = dict(defaults or {})
        self.omit = tuple(omit)
        self.yaml_flag = yaml_flag
        self.settings: list[Setting] = []
        self.sections: list[tuple[str, type]] = [("", root)]
        self._collect(root, "")
        known = {s.path for s in self.settings} | {p for p, _ in self.sections}
        for key in self.defaults:
            if key not in known:
                raise ConfigError(f"{key}: a default for a setting {root.__name__} does not have")

    def _omitted(self, path: str) -> bool:
        return any(path == o or path.startswith(o + ".") for o in self.omit)

    def _collect(self, cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        sections = []
        for f in dataclasses.fields(cls):
            path, hint = prefix + f.name, hints[f.name]
            if self._omitted(path):
                continue
            if _section_of(f, hint) is not None:
                sections.append((path, _section_of(f, hint)))
                continue
            if _meta(f)["skip"]:
                continue
            default = self.defaults.get(path, _default(f))
            required = not _has_default(f) and path not in self.defaults
            self.settings.append(Setting(path, cls, f, hint, default, required))
        for path, hint in sections:  # settings first, then sections: --help reads top-down
            self.sections.append((path, hint))
            self._collect(hint, path + ".")

    # -- flags ---------------------------------------------------------------------------------------
    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add ``--config FILE`` and one argument group per section, one flag per setting."""
        if self.yaml_flag:
            parser.add_argument(self.yaml_flag, metavar="FILE", dest=_DEST, default=argparse.SUPPRESS,
                                help="YAML file configuring the whole tree (its keys are the dotted names "
                                     "below); flags given here override it")
        groups: dict[str, Any] = {}
        for path, cls in self.sections:
            doc = help_text((inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")).replace("%", "%%")
            if path:
                groups[path] = parser.add_argument_group(f"{path}", doc)
            else:
                groups[path] = parser.add_argument_group("general", doc) \
                    if any(s.path.count(".") == 0 for s in self.settings) else parser
        for s in self.settings:
            section = s.path.rpartition(".")[0]
            self._add_setting(groups[section], s)

    def _add_setting(self, group: Any, s: Setting) -> None:
        meta = s.meta
        doc = help_text(_docs(s.owner).get(s.field.name, ""))
        shown = meta["default_text"] if meta["default_text"] is not None else s.default
        if isinstance(shown, bool):
            shown = "true" if shown else "false"
        states_default = _STATED_DEFAULT.search(doc) is not None  # the docstring says it already: once is enough
        help_ = doc + ("" if s.required or states_default or shown in (None, (), []) else f" (default: {shown})")
        help_ = help_.replace("%", "%%")
        kw: dict[str, Any] = {"dest": s.dest, "default": argparse.SUPPRESS, "help": help_}
        base = _base(s.hint)
        if meta["positional"]:
            kw.pop("dest")
            kw["metavar"] = meta["metavar"] or s.field.name.upper()
            kw["type"] = meta["parse"] or (base if base in (int, float, str) else str)
            if not s.required:
                kw["nargs"] = "?"
            self._shows(group.add_argument(s.dest, **kw), s, shown)
            return
        flat = s.flat_names()
        # A root setting's dotted name is its field name: kept only where no flat name stands for it.
        dotted = ["--" + s.path] if "." in s.path or not flat else []
        if s.is_bool:
            if dotted:
                self._shows(group.add_argument(*dotted, type=parse_bool, metavar="BOOL", **kw), s, shown)
            for name in flat:
                # A flat switch turns its setting on, or off when it defaults to true (``--no-checksums``).
                value = not bool(s.default) if name.startswith("--no-") else True
                group.add_argument(name, action="store_const", const=value, dest=s.dest, default=argparse.SUPPRESS,
                                   help=f"the same as {dotted[0]} {str(value).lower()}" if dotted else help_)
            return
        if typing.get_origin(base) is tuple or meta["append"]:
            kw["action" if meta["append"] else "nargs"] = "append" if meta["append"] else "+"
            item = (typing.get_args(base) or (str,))[0]
            kw["type"] = meta["parse"] or (item if item in (int, float, str) else str)
        else:
            kw["type"] = meta["parse"] or (base if base in (int, float, str) else str)
        if meta["choices"]:
            kw["choices"] = meta["choices"]
        if meta["metavar"] or not meta["choices"]:
            kw["metavar"] = meta["metavar"] or _METAVARS.get(kw["type"], "TEXT")
        self._shows(group.add_argument(*dotted, *flat, **kw), s, shown)

    @staticmethod
    def _shows(action: argparse.Action, s: Setting, shown: Any) -> None:
        # What the help states as the default: argparse's own default stays SUPPRESS, so that only
        # flags given on the command line override a --config file.
        action.config_default = None if s.required else shown  # type: ignore[attr-defined]

    # -- building ------------------------------------------------------------------------------------
    def values(self, args: argparse.Namespace) -> dict[str, Any]:
        """The nested map of what ``--config FILE`` and the flags given set (flags win)."""
        given = vars(args)
        data: dict[str, Any] = read_tree(self.root, load_yaml(given[_DEST])) if given.get(_DEST) else {}
        for s in self.settings:
            if s.dest in given:
                value = given[s.dest]
                _put(data, s.path, tuple(value) if isinstance(value, list) else value)
        return data

    def parse_args(self, argv: Any = None, *, prog: str) -> Any:
        """The validated config of a process's own command line (``argv``, else ``sys.argv``); a bad value
        exits with argparse's usage error naming it."""
        parser = argparse.ArgumentParser(prog=prog)
        self.add_to(parser)
        try:
            return self.build(parser.parse_args(argv))
        except ConfigError as exc:
            parser.error(str(exc))

    def build(self, args: argparse.Namespace | Mapping[str, Any], **overrides: Any) -> Any:
        """The validated root config of parsed flags (or of a nested map); ``overrides`` map dotted
        paths to values that win over both."""
        data = self.values(args) if isinstance(args, argparse.Namespace) else _copy(args)
        for path, value in overrides.items():
            _put(data, path, value)
        return self._make(self.root, data, "")

    def _make(self, cls: type, data: Any, prefix: str) -> Any:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: expected a map of settings, "
                              f"got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key in data:
            if key not in fields:
                raise ConfigError(f"{prefix}{key}: unknown setting (known: {', '.join(sorted(fields))})")
        kwargs: dict[str, Any] = {}
        for name, f in fields.items():
            path, section = prefix + name, _section_of(f, hints[name])
            if section is not None:
                value = data.get(name)
                if name in data and _built(value, section, hints[name]):
                    kwargs[name] = value  # built in code (a config object, or what the section resolves to)
                elif value is not None and not isinstance(value, Mapping):
                    raise ConfigError(f"{path}: expected a map of settings, got {_kind(value)}")
                elif name in data or self._has_defaults_under(path) or not _has_default(f):
                    kwargs[name] = self._make(section, value or {}, path + ".")
            elif name in data:
                value = data[name]
                # YAML has lists only; a tuple setting keeps its type whichever way it was given
                is_tuple = typing.get_origin(_base(hints[name])) is tuple
                kwargs[name] = tuple(value) if is_tuple and isinstance(value, list) else value
            elif path in self.defaults:
                kwargs[name] = self.defaults[path]
            elif not _has_default(f):
                setting = next((s for s in self.settings if s.path == path), None)
                names = setting.flat_names() if setting is not None else []
                raise ConfigError(f"{path}: required ({names[0] if names else '--' + path})")
        return cls(**kwargs)

    def _has_defaults_under(self, path: str) -> bool:
        return any(k.startswith(path + ".") for k in self.defaults)


def _built(value: Any, section: type, hint: Any) -> bool:
    """Whether a section's value is an object built in code (not a map of its settings)."""
    if value is None or isinstance(value, Mapping):
        return False
    classes = [c for c in (section, _base(hint)) if isinstance(c, type) and dataclasses.is_dataclass(c)]
    return any(isinstance(value, c) for c in classes)


def _kind(value: Any) -> str:
    """A YAML value's kind as an error names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, Mapping):
        return "a map"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    return f"{type(value).__name__} {value!r}"


def _flag_of(path: str, f: dataclasses.Field) -> str:
    """The flag a setting's errors name: its flat name, else its dotted one."""
    meta = _meta(f)
    if meta["flat"] and not meta["positional"]:
        return meta["name"] or "--" + f.name.replace("_", "-")
    return "--" + path


def read_tree(cls: type, data: Any, prefix: str = "") -> dict[str, Any]:
    """A YAML map of ``cls``'s tree with every setting read as its flag reads it: the same parser
    (``parse_bool``, ``int``, ``float``, the field's ``parse``), the same choices, ``X | None`` taking
    null, a tuple taking a list (or one value, as its flag does). A section is a map, or null for its
    defaults. A bad value raises :class:`ConfigError` naming its dotted key and its flag; keys the
    tree does not have are left for :meth:`ConfigTree.build` to name."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: expected a map of settings, got {_kind(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        f = fields.get(key) if isinstance(key, str) else None
        if f is None:
            out[key] = value
            continue
        path, section = prefix + key, _section_of(f, hints[key])
        if section is not None:
            if value is None:
                continue  # ``data_plane:`` with nothing under it: the section's defaults
            if not isinstance(value, Mapping):
                raise ConfigError(f"{path}: expected a map of settings, got {_kind(value)}")
            out[key] = read_tree(section, value, path + ".")
        else:
            out[key] = _read_setting(path, f, hints[key], value)
    return out


def _optional(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def _read_setting(path: str, f: dataclasses.Field, hint: Any, value: Any, flag_name: str | None = None) -> Any:
    meta, base = _meta(f), _base(hint)
    if flag_name is None:
        flag_name = f" ({_flag_of(path, f)})"
    where = path + flag_name
    if value is None:
        if _optional(hint):
            return None
        raise ConfigError(f"{where}: expected a value, got null")
    if typing.get_origin(base) is tuple or meta["append"]:
        item = (typing.get_args(base) or (str,))[0] if typing.get_origin(base) is tuple else base
        items = value if isinstance(value, (list, tuple)) else [value]  # one value, as ``--flag VALUE`` gives
        return tuple(_read_value(where if len(items) == 1 else f"{path}[{i}]{flag_name}", meta, item, v)
                     for i, v in enumerate(items))
    return _read_value(where, meta, base, value)


def _read_value(where: str, meta: dict[str, Any], base: Any, value: Any) -> Any:
    """One YAML scalar read as the flag reads its text."""
    parse = meta["parse"]
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (str, int)) and not isinstance(value, float):
            parse = parse_bool
        else:
            raise ConfigError(f"{where}: expected true or false, got {_kind(value)}")
    elif isinstance(value, Mapping) and not isinstance(base, type):
        return dict(value)  # one of a union's settings objects given as a map (transfer_queue.config)
    elif isinstance(base, type) and dataclasses.is_dataclass(base) and parse is None:
        if isinstance(value, base):
            return value
        if isinstance(value, Mapping):  # a shape written out in YAML (data_plane.model)
            return _read_object(where, base, value)
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a name or a map, got {_kind(value)}")
        parse = str
    elif base in (int, float) or parse is not None and not (base is str or _has_str(base)):
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ConfigError(f"{where}: expected a number, got {_kind(value)}")
        value, parse = str(value), parse or base
    else:  # text: a path, a URL, a name
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected text, got {_kind(value)} (quote it to make it text)")
        parse = parse or str
    try:
        out = parse(value)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except ConfigError as exc:  # a parser that names its flag already: named once
        message = str(exc)
        for name in where.replace("(", "").replace(")", "").split():
            message = message.removeprefix(name + ": ")
        raise ConfigError(f"{where}: {message}") from None
    except (TypeError, ValueError):
        name = getattr(parse, "__name__", "value")
        raise ConfigError(f"{where}: invalid {name} value: {value!r}") from None
    if meta["choices"] and out not in meta["choices"]:
        raise ConfigError(f"{where}: invalid choice: {out!r} (choose from {', '.join(map(str, meta['choices']))})")
    return out


def _has_str(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and str in typing.get_args(hint)


def _read_object(where: str, cls: type, value: Mapping[str, Any]) -> Any:
    """A dataclass-typed setting given as a map of its fields, each checked for its type."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    path = where.partition(" ")[0]
    for key in value:
        if key not in fields:
            raise ConfigError(f"{path}.{key}: unknown setting (known: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, f in fields.items():
        if name in value:
            kwargs[name] = _read_setting(f"{path}.{name}", f, hints[name], value[name], flag_name="")
        elif not _has_default(f):
            needed = [n for n, g in fields.items() if not _has_default(g)]
            raise ConfigError(f"{path}.{name}: required (given as a map, {path} needs {', '.join(needed)})")
    return cls(**kwargs)


def _put(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = data
    for key in parents:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {} if child is None else _copy(child)
        node = child
    node[last] = value


def _copy(data: Any) -> Any:
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return {f.name: getattr(data, f.name) for f in dataclasses.fields(data)}
    if isinstance(data, Mapping):
        return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    return data


def read_secret_file(path: str | os.PathLike[str], what: str) -> str:
    """The token a file holds: its whole text with the whitespace around it (a trailing newline) stripped.

    ConfigError naming ``what`` (the setting and its flag) and the file when it cannot be read, is not
    UTF-8 text, is empty (only whitespace), or holds more than one line: a token file holds the token alone.
    """
    name = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 16)
    except (OSError, UnicodeDecodeError) as exc:
        why = (exc.strerror or str(exc)) if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{what}: cannot read {name!r}: {why}") from None
    token = text.strip()
    if not token:
        raise ConfigError(f"{what}: {name!r} is empty; it must hold the token")
    if "\n" in token or "\r" in token:
        raise ConfigError(f"{what}: {name!r} holds more than one line; it must hold the token alone")
    return token


def check_writable(path: str | os.PathLike[str], what: str, *, make_parents: bool = False) -> None:
    """ConfigError naming ``what`` unless a file can be written at ``path`` (its directory made first with
    ``make_parents``): checked before a long run or a drain, which an output that cannot be written would
    otherwise lose. Leaves no file behind."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ConfigError(f"{what}: {path!r} is a directory")
    parent = Path(path).parent
    try:
        if make_parents:
            parent.mkdir(parents=True, exist_ok=True)
        existed = os.path.lexists(path)
        with open(path, "a", encoding="utf-8"):
            pass
        if not existed:
            os.unlink(path)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (parent, *parent.parents) if p.exists() and not p.is_dir()), parent)
        raise ConfigError(f"{what}: cannot write {path!r}: {str(blocker)!r} is a file, not a folder") from None
    except OSError as exc:
        raise ConfigError(f"{what}: cannot write {path!r}: {exc.strerror or exc}") from None


def load_yaml(path: str | os.PathLike[str], *, what: str = "--config") -> dict[str, Any]:
    """The map a YAML settings file holds (an empty file is an empty map); ``what`` names the file's
    role in every error (``--config``, ``transfer_queue``)."""
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {os.fspath(path)!r}: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what}: {os.fspath(path)!r} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: {os.fspath(path)!r} holds a {type(data).__name__}, not a map of settings")
    return data


def config_to_dict(config: Any) -> Any:
    """A config as plain YAML-ready values: sections as maps, tuples as lists; a value that knows
    its own plain form (``to_dict``) gives it."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        out = {}
        for f in dataclasses.fields(config):
            value, section = getattr(config, f.name), _meta(f)["section"]
            if section is not None and not isinstance(value, section):
                value = section.of(value)
            out[f.name] = config_to_dict(value)
        return out
    if isinstance(config, (tuple, list)):
        return [config_to_dict(v) for v in config]
    if isinstance(config, Mapping):
        return {k: config_to_dict(v) for k, v in config.items()}
    return config
