"""The ``dressage`` command: one subcommand per module of this package.

Each command module defines ``register(subparsers)``, which adds its parser and sets
``func(args) -> int``. Configuration is validated into dataclasses at this edge; the library
below never sees an argparse Namespace.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dressage.errors import DressageError

__all__ = ["main", "build_parser"]

# Subcommand modules, in the order `dressage --help` lists them.
COMMANDS = ("run", "proxy", "engine", "capacity", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dressage",
        description="Trajectory data plane for long-context agentic RL (Proxy, Segments, TransferQueue).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"dressage.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DressageError as exc:
        print(f"dressage {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
