"""Parsing and printing sizes: token counts (``64K``) and byte sizes (``2TB``, ``1.82TiB``)."""

from __future__ import annotations

import math
import re

from dressage.errors import ConfigError

__all__ = ["parse_bytes", "parse_count", "format_bytes"]

_BYTE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4, "p": 1000**5, "pb": 1000**5,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5,
}
_COUNT_UNITS = {"": 1, "k": 1024, "m": 1024**2}
_NUM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def _split(text: str | int | float, what: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise ConfigError(f"{what}: expected a number, got {text!r}")
    if isinstance(text, (int, float)):
        value, unit = (float(text) if abs(text) < 1e300 else math.inf), ""
    else:
        m = _NUM.match(str(text))
        if not m:
            raise ConfigError(f"{what}: cannot parse {text!r}")
        value, unit = float(m.group(1)), m.group(2).lower()
    if not math.isfinite(value):
        raise ConfigError(f"{what}: expected a finite number, got {text!r}")
    return value, unit


def parse_bytes(text: str | int | float, what: str = "size") -> int:
    """``"2TB"`` -> 2e12, ``"1.82TiB"`` -> 1.82 * 2**40, ``"512MiB"``, ``4096``. Decimal units are SI."""
    value, unit = _split(text, what)
    if unit not in _BYTE_UNITS:
        raise ConfigError(f"{what}: unknown unit {unit!r} in {text!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    scaled = value * _BYTE_UNITS[unit]
    if not math.isfinite(scaled):
        raise ConfigError(f"{what}: too large, got {text!r}")
    out = int(round(scaled))
    if out <= 0:
        raise ConfigError(f"{what}: must be positive, got {text!r}")
    return out


def parse_count(text: str | int, what: str = "count") -> int:
    """Token counts as model cards write them: ``64K`` = 65,536, ``256K`` = 262,144, ``1M``."""
    value, unit = _split(text, what)
    if unit not in _COUNT_UNITS:
        raise ConfigError(f"{what}: unknown suffix {unit!r} in {text!r} (use K or M)")
    out = value * _COUNT_UNITS[unit]
    if not math.isfinite(out):
        raise ConfigError(f"{what}: too large, got {text!r}")
    if out != int(out) or out <= 0:
        raise ConfigError(f"{what}: must be a positive whole number, got {text!r}")
    return int(out)


def format_bytes(n: float) -> str:
    """Binary units, three significant digits: ``format_bytes(2.34 * 2**40) == '2.34 TiB'``; from 1000
    to 1023 of a unit, the whole number (``'1010 GiB'``: never ``1.01e+03``)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            text = f"{n:.3g}"
            return f"{n:.0f} {unit}" if unit == "B" or "e" in text else f"{text} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
