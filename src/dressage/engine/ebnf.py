"""``ebnf`` constrained decoding for the built-in engine: a reply drawn from the seeded generator
that the grammar derives.

The grammar is SGLang's (xgrammar's) EBNF: ``name ::= expression`` rules with ``root`` the start,
``"literals"`` (JSON escapes, ``\\xNN``), character classes ``[a-z]`` / ``[^...]``, rule names,
``( )`` groups, ``|`` alternatives and the ``* + ?`` and ``{m,n}`` repetitions. Repetitions draw a
few items (each more with probability 0.3); deep in the derivation the shortest alternative is taken, so every draw ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dressage.errors import EngineRequestError

__all__ = ["Grammar", "parse_grammar"]

_ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,"
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "]": "]",
            "[": "[", "-": "-", "^": "^"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_DEEP = 12
_MORE = 0.3
"""The chance that a repetition draws one more item: short lists, one call more often than two."""


def _bad(msg: str) -> EngineRequestError:
    return EngineRequestError(f"sampling_params.ebnf: {msg}", status_code=400)


@dataclass(frozen=True, slots=True)
class Grammar:
    """A parsed grammar: each rule's expression as nested tuples."""

    source: str
    rules: dict[str, Any] = field(hash=False, compare=False)
    min_len: dict[str, int] = field(hash=False, compare=False)

    def sample(self, rng: np.random.Generator) -> str:
        """A text the grammar derives from ``root``."""
        out: list[str] = []
        self._emit(("ref", "root"), rng, 0, out)
        return "".join(out)

    def _emit(self, node: Any, rng: np.random.Generator, depth: int, out: list[str]) -> None:
        kind = node[0]
        if kind == "lit":
            out.append(node[1])
        elif kind == "ref":
            self._emit(self.rules[node[1]], rng, depth + 1, out)
        elif kind == "seq":
            for item in node[1]:
                self._emit(item, rng, depth, out)
        elif kind == "alt":
            options = node[1]
            if depth > _DEEP:
                pick = min(options, key=lambda o: _min_len(o, self.min_len))
            else:
                pick = options[int(rng.integers(len(options)))]
            self._emit(pick, rng, depth, out)
        elif kind == "rep":
            _, item, low, high = node
            top = low if depth > _DEEP else min(high if high is not None else low + 3, low + 3)
            count = low
            while count < top and rng.random() < _MORE:
                count += 1
            for _ in range(count):
                self._emit(item, rng, depth + 1, out)
        elif kind == "cls":
            out.append(_class_char(node[1], node[2], rng))


def _class_char(negated: bool, chars: frozenset[str], rng: np.random.Generator) -> str:
    pool = [c for c in _ALPHABET if c not in chars] if negated else sorted(chars)
    if not pool:
        raise _bad("a character class allows no character this engine draws")
    return pool[int(rng.integers(len(pool)))]


def _min_len(node: Any, known: dict[str, int]) -> int:
    kind = node[0]
    if kind == "lit":
        return len(node[1])
    if kind == "ref":
        return known.get(node[1], 1 << 30)
    if kind == "seq":
        return min(sum(_min_len(n, known) for n in node[1]), 1 << 30)
    if kind == "alt":
        return min(_min_len(n, known) for n in node[1])
    if kind == "rep":
        return min(node[2] * _min_len(node[1], known), 1 << 30)
    return 1


class _Reader:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def skip(self) -> None:
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in " \t\r\n":
                self.pos += 1
            elif c == "#":
                while self.pos < len(self.text) and self.text[self.pos] != "\n":
                    self.pos += 1
            else:
                return

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def at_rule_start(self) -> bool:
        self.skip()
        m = _NAME.match(self.text, self.pos)
        return bool(m) and self.text[m.end():].lstrip(" \t").startswith("::=")

    def escape(self) -> str:
        c = self.text[self.pos]
        if c in "xu":
            n = 2 if c == "x" else 4
            code = self.text[self.pos + 1:self.pos + 1 + n]
            if len(code) != n or not all(h in "0123456789abcdefABCDEF" for h in code):
                raise _bad(f"bad \\{c} escape at {self.pos}")
            self.pos += 1 + n
            return chr(int(code, 16))
        self.pos += 1
        if c not in _ESCAPES:
            raise _bad(f"unknown escape \\{c} at {self.pos}")
        return _ESCAPES[c]


def _expr(r: _Reader) -> Any:
    alts = [_seq(r)]
    while r.peek() == "|":
        r.pos += 1
        alts.append(_seq(r))
    return alts[0] if len(alts) == 1 else ("alt", tuple(alts))


def _seq(r: _Reader) -> Any:
    items = []
    while True:
        c = r.peek()
        if not c or c in "|)" or r.at_rule_start():
            break
        items.append(_postfix(r, _atom(r)))
    return items[0] if len(items) == 1 else ("seq", tuple(items))


def _atom(r: _Reader) -> Any:
    c = r.peek()
    if c == '"':
        r.pos += 1
        out = []
        while True:
            if r.pos >= len(r.text):
                raise _bad("unterminated string literal")
            ch = r.text[r.pos]
            if ch == '"':
                r.pos += 1
                return ("lit", "".join(out))
            if ch == "\\":
                r.pos += 1
                out.append(r.escape())
            else:
                out.append(ch)
                r.pos += 1
    if c == "[":
        r.pos += 1
        negated = r.text.startswith("^", r.pos)
        r.pos += negated
        chars: set[str] = set()
        while True:
            if r.pos >= len(r.text):
                raise _bad("unterminated character class")
            ch = r.text[r.pos]
            if ch == "]":
                r.pos += 1
                break
            if ch == "\\":
                r.pos += 1
                ch = r.escape()
            else:
                r.pos += 1
            if r.text.startswith("-", r.pos) and not r.text.startswith("-]", r.pos):
                r.pos += 1
                hi = r.text[r.pos]
                if hi == "\\":
                    r.pos += 1
                    hi = r.escape()
                else:
                    r.pos += 1
                if ord(hi) < ord(ch):
                    raise _bad(f"empty range {ch!r}-{hi!r}")
                if ord(hi) - ord(ch) > 0x3000:
                    chars.update(c2 for c2 in _ALPHABET if ch <= c2 <= hi)
                else:
                    chars.update(chr(o) for o in range(ord(ch), ord(hi) + 1))
            else:
                chars.add(ch)
        return ("cls", negated, frozenset(chars))
    if c == "(":
        r.pos += 1
        inner = _expr(r)
        if r.peek() != ")":
            raise _bad(f"expected ')' at {r.pos}")
        r.pos += 1
        return inner
    m = _NAME.match(r.text, r.pos)
    if not m:
        raise _bad(f"unexpected {r.text[r.pos:r.pos + 10]!r} at {r.pos}")
    r.pos = m.end()
    return ("ref", m.group(0))


def _postfix(r: _Reader, node: Any) -> Any:
    while r.pos < len(r.text):
        c = r.text[r.pos]
        if c == "*":
            node = ("rep", node, 0, None)
        elif c == "+":
            node = ("rep", node, 1, None)
        elif c == "?":
            node = ("rep", node, 0, 1)
        elif c == "{":
            m = re.compile(r"\{\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}").match(r.text, r.pos)
            if not m:
                raise _bad(f"bad repetition at {r.pos}")
            low = int(m.group(1))
            high = low if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
            if high is not None and high < low:
                raise _bad(f"bad repetition {m.group(0)}")
            node = ("rep", node, low, high)
            r.pos = m.end()
            continue
        else:
            return node
        r.pos += 1
    return node


def _refs(node: Any, out: set[str]) -> None:
    if node[0] == "ref":
        out.add(node[1])
    elif node[0] in ("seq", "alt"):
        for n in node[1]:
            _refs(n, out)
    elif node[0] == "rep":
        _refs(node[1], out)


def parse_grammar(raw: Any) -> Grammar:
    """The grammar of SGLang's ``ebnf`` sampling parameter, checked (400 naming the problem)."""
    if not isinstance(raw, str) or not raw.strip():
        raise _bad("must be a non-empty string")
    r = _Reader(raw)
    rules: dict[str, Any] = {}
    while r.peek():
        m = _NAME.match(r.text, r.pos)
        if not m or not r.at_rule_start():
            raise _bad(f"expected a rule 'name ::= ...' at {r.pos}")
        r.pos = m.end()
        r.skip()
        r.pos += 3
        if m.group(0) in rules:
            raise _bad(f"rule {m.group(0)!r} is defined twice")
        rules[m.group(0)] = _expr(r)
    if "root" not in rules:
        raise _bad("no root rule")
    used: set[str] = set()
    for node in rules.values():
        _refs(node, used)
    missing = sorted(used - set(rules))
    if missing:
        raise _bad(f"undefined rule(s) {', '.join(missing)}")
    min_len: dict[str, int] = {}
    for _ in range(len(rules) + 1):  # a fixed point: each pass settles at least one more rule
        changed = False
        for name, node in rules.items():
            value = _min_len(node, min_len)
            if value < min_len.get(name, 1 << 30):
                min_len[name], changed = value, True
        if not changed:
            break
    endless = sorted(n for n in rules if n not in min_len)
    if endless:
        raise _bad(f"rule(s) {', '.join(endless)} derive no finite text")
    return Grammar(raw, rules, min_len)
