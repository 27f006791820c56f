"""Policy versions as the engine names them (strings) and as tokens store them (int32 codes).

SGLang reports ``meta_info.weight_version`` as a string (``"default"`` unless the trainer sets
one). Tokens carry an int32 version, so a :class:`VersionTable` maps each engine string to a
code: a string that spells a non-negative integer below :data:`NAMED_BASE` is that integer (a
trainer counting steps sees its own numbers), any other string gets the next code from
:data:`NAMED_BASE` on, and :meth:`VersionTable.label` turns a code back into the engine's string.
"""

from __future__ import annotations

import threading

from dressage.errors import ConfigError

__all__ = ["VersionTable", "NAMED_BASE"]

NAMED_BASE = 1 << 30
"""First code given to a version string that is not a plain integer."""


class VersionTable:
    """Engine version strings <-> int32 token versions, stable for the life of the table."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        self._labels: dict[int, str] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _numeric(version: str) -> int | None:
        text = version.strip()
        if text.isdigit() and text.isascii():
            value = int(text)
            if value < NAMED_BASE:
                return value
        return None

    def code(self, version: object) -> int:
        """The token version for an engine's ``weight_version`` (an int passes through)."""
        if isinstance(version, bool) or not isinstance(version, (str, int)):
            raise ConfigError(f"a weight version must be a string or an integer, got {version!r}")
        if isinstance(version, int):
            if not 0 <= version < NAMED_BASE:
                raise ConfigError(f"weight version {version} is outside 0..{NAMED_BASE - 1}")
            return version
        if not version.strip():
            raise ConfigError("a weight version must not be empty")
        numeric = self._numeric(version)
        if numeric is not None:
            return numeric
        with self._lock:
            code = self._codes.get(version)
            if code is None:
                code = NAMED_BASE + len(self._codes)
                self._codes[version] = code
                self._labels[code] = version
            return code

    def label(self, code: int) -> str:
        """The engine's string for a token version (a plain integer prints as itself)."""
        code = int(code)
        with self._lock:
            named = self._labels.get(code)
        return named if named is not None else str(code)

    def named(self) -> dict[str, int]:
        """Every non-numeric version seen so far, with its code."""
        with self._lock:
            return dict(self._codes)
