"""The ``dressage`` command: one subcommand per module of this package, plus installed plugins.

Each command module defines ``register(subparsers)``, which adds its parser and sets
``func(args) -> int``. Configuration is validated into dataclasses at this edge; the library
below never sees an argparse Namespace.

Other installed packages add subcommands through the ``dressage.commands`` entry-point group: the
entry point's name is the command and its object is a ``register(subparsers)`` like the built-in ones.
The benchmarks (``dressage bench``) come this way from the ``dressage-bench`` package in
``benchmarks/``; without it, ``dressage bench`` says how to install it and exits with status 2. A
plugin that fails to import does not take the other commands down: its command reports the error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib import metadata
from typing import Callable

from dressage.errors import DressageError

__all__ = ["main", "build_parser", "ENTRY_POINT_GROUP", "plugin_commands"]

# Third-party modules an optional extra brings, so a missing one is a one-line hint, not a traceback.
EXTRA_OF_MODULE = {"fastapi": "server", "uvicorn": "server", "httpx": "server", "openai": "server",
                   "starlette": "server", "pydantic": "server", "ray": "ray", "grpc": "ray",
                   "matplotlib": "plot", "pyarrow": "export", "torch": "torch", "transformers": "hf", "tokenizers": "hf"}

# Subcommand modules, in the order `dressage --help` lists them.
COMMANDS = ("run", "proxy", "engine", "tq", "capacity", "trainer", "export")
ENTRY_POINT_GROUP = "dressage.commands"
# Commands that packages of this repository provide, with how to get them when they are missing.
KNOWN_PLUGINS = {
    "bench": ("benchmarks: TransferQueue bandwidth, data-plane memory, faults, scale curves",
              "not installed: it comes with the dressage-bench package; run `pip install -e benchmarks` "
              "in the repository root (`make test` does)"),
}


def plugin_commands() -> list[metadata.EntryPoint]:
    """The installed ``dressage.commands`` entry points, one per name (the first one found wins)."""
    seen: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in COMMANDS:
            seen.setdefault(ep.name, ep)
    return sorted(seen.values(), key=lambda ep: ep.name)


def _unavailable(sub: argparse._SubParsersAction, name: str, help_text: str, message: str) -> None:
    """A placeholder command: any arguments, one line on stderr, exit status 2."""
    p = sub.add_parser(name, help=f"{help_text} (not installed)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)

    def refuse(args: argparse.Namespace) -> int:
        print(f"dressage {name}: {message}", file=sys.stderr)
        return 2

    p.set_defaults(func=refuse, accepts_any_arguments=True)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dressage")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dressage",
        description="Trajectory data plane for long-context agentic RL (Proxy, Segments, TransferQueue).",
    )
    parser.add_argument("--version", action="version", version=f"dressage {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"dressage.cli.{name}").register(sub)
    found = set()
    for ep in plugin_commands():
        found.add(ep.name)
        try:
            register: Callable[[argparse._SubParsersAction], None] = ep.load()
        except Exception as exc:  # a broken plugin must not take `dressage run` down with it
            _unavailable(sub, ep.name, KNOWN_PLUGINS.get(ep.name, ("plugin command",))[0],
                         f"the command's package failed to load ({ep.value}): {type(exc).__name__}: {exc}")
            continue
        register(sub)
    for name, (help_text, hint) in KNOWN_PLUGINS.items():
        if name not in found:
            _unavailable(sub, name, help_text, hint)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args) or 0)
    except DressageError as exc:
        print(f"dressage {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in EXTRA_OF_MODULE:
            raise
        print(f"dressage {args.command}: error: this needs {top}, which the '{EXTRA_OF_MODULE[top]}' extra "
              f"installs: pip install 'dressage[{EXTRA_OF_MODULE[top]}]'", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
