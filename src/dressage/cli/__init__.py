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

# Third-party modules an optional extra brings, so a missing one is a one-line hint, not a traceback.
EXTRA_OF_MODULE = {"fastapi": "server", "uvicorn": "server", "httpx": "server", "openai": "server",
                   "starlette": "server", "pydantic": "server", "ray": "ray", "grpc": "ray",
                   "matplotlib": "plot", "torch": "torch", "transformers": "hf", "tokenizers": "hf"}

# Subcommand modules, in the order `dressage --help` lists them.
COMMANDS = ("run", "proxy", "engine", "capacity", "bench")


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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
