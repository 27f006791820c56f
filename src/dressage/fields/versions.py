"""Policy versions as the engine names them (strings) and as tokens store them (int32 codes).

SGLang reports ``meta_info.weight_version`` as a string (``"default"`` unless the trainer sets
one). Tokens carry an int32 version, so a :class:`VersionTable` maps each engine string to a
code: a string that spells a non-negative integer below :data:`NAMED_BASE` is that integer (a
trainer counting steps sees its own numbers), any other string gets the next code from
:data:`NAMED_BASE` on, and :meth:`VersionTable.label` turns a code back into the engine's string.

Order: codes compare as the versions' order. Numeric versions compare as numbers; a named version
is newer than every numeric one and than every named one seen before it (a monotonic index per
distinct string, in order of first sight), so a trainer's staleness check is ``current - code``
for numbers and the count of distinct versions in between for names. The table is the Proxy's:
:meth:`VersionTable.restore` takes back codes recorded before a restart.
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
        self._next = NAMED_BASE
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
                code = self._next
                self._codes[version] = code
                self._labels[code] = version
                self._next += 1
            return code

    def restore(self, version: str, code: int) -> None:
        """Take back a named version's code from an earlier life of the table (a journal);
        later new names get codes above it."""
        code = int(code)
        if not isinstance(version, str) or self._numeric(version) is not None or not NAMED_BASE <= code < 1 << 31:
            raise ConfigError(f"weight version {version!r} cannot have the recorded code {code}")
        with self._lock:
            known = self._codes.get(version)
            if known == code:
                return
            if known is not None or code in self._labels:
                raise ConfigError(f"weight version {version!r} recorded as {code}, but the table has "
                                  f"{known if known is not None else self._labels[code]!r} there")
            self._codes[version], self._labels[code] = code, version
            self._next = max(self._next, code + 1)

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
