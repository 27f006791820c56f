"""What the engine says: readable reply text or a tool call, stop handling, and logprobs.

A reply is planned whole from one seeded generator (length, words, logprobs), then cut at the
first stop event as SGLang's scheduler would find it token by token: a stop token id, a stop
string, or ``max_new_tokens``. The ids are kept whole up to that event (a stop string's own tokens
included); only the answer's text drops the stop string, unless ``no_stop_trim``.

Sampling parameters act as their analogues: the seed, temperature, top_p / top_k / min_p pick
the draw (greedy draws ignore the seed); the penalties make the words of a reply repeat less
(positive) or more (negative); ``json_schema`` makes the reply a JSON document of the schema,
``ebnf`` a text of the grammar (a forced tool call, say); either is the whole reply, its tokens the
tokenizer's encoding of that text.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dressage.engine.json_schema import sample_json
from dressage.engine.protocol import SamplingParams
from dressage.tokenizer import Tokenizer
from dressage.tokenizer.chatml import (IM_START, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TOOL_RESPONSE_OPEN, TOOLS_CLOSE,
                                       TOOLS_OPEN)

__all__ = ["Draft", "plan_reply", "offered_tools", "ends_with_tool_results", "wants_reasoning"]

_WORDS = tuple(
    "the a of to and in that is for it as with was on be by this are at from have or an they which "
    "one you we all there their were can more when time will out so some would about into than them "
    "only its two other new way could use over any these may first then do most also after did many "
    "model token data step segment reward policy expert layer route store batch value state agent tool "
    "call result query search file code test plan check read write update list find answer reason "
    "because however therefore next small large fast slow clear simple exact long short early late "
    "good better best well still just now here where while since until every each both few".split()
)


@dataclass(slots=True)
class Draft:
    """One planned reply, already cut at its stop event."""

    ids: np.ndarray                 # int32 [R]
    logprobs: np.ndarray            # float32 [R]
    finish_reason: dict[str, Any]   # SGLang's finish_reason JSON
    stop_str: str | None = None     # a matched stop string, trimmed from the text


def offered_tools(prompt_text: str) -> list[dict[str, Any]]:
    """The function specs listed in the prompt's ``<tools>`` sections (one JSON object per line).

    Every ``<tools>...</tools>`` span is read: a template's prose may name the tags before the
    list itself (Qwen3: "within <tools></tools> XML tags"), and such a span holds no spec.
    """
    tools: list[dict[str, Any]] = []
    pos = 0
    while True:
        start = prompt_text.find(TOOLS_OPEN, pos)
        if start < 0:
            return tools
        end = prompt_text.find(TOOLS_CLOSE, start)
        section = prompt_text[start + len(TOOLS_OPEN): end if end >= 0 else None]
        pos = len(prompt_text) if end < 0 else end + len(TOOLS_CLOSE)
        for line in section.splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                spec = json.loads(line)
            except json.JSONDecodeError:
                continue
            fn = spec.get("function", spec) if isinstance(spec, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                tools.append(fn)


def ends_with_tool_results(prompt_text: str) -> bool:
    """The turn before the prompt's final (generation) turn holds ``<tool_response>`` blocks."""
    last = prompt_text.rfind(IM_START)
    if last <= 0:
        return False
    previous = prompt_text.rfind(IM_START, 0, last)
    return previous >= 0 and TOOL_RESPONSE_OPEN in prompt_text[previous:last]


def _pressured(rng: np.random.Generator, idx: np.ndarray, pressure: float, counts: dict[int, int]) -> np.ndarray:
    """Word choices under repeat pressure: a word used c times before is drawn again with
    probability 1 - exp(-pressure * c) (> 0), or the previous word comes back with probability
    1 - exp(pressure) (< 0). ``counts`` carries the uses over the reply's blocks."""
    out = idx.copy()
    for k in range(len(out)):
        if pressure < 0 and k and rng.random() < 1.0 - math.exp(pressure):
            out[k] = out[k - 1]
        elif pressure > 0:
            for _ in range(4):
                seen = counts.get(int(out[k]), 0)
                if not seen or rng.random() >= 1.0 - math.exp(-pressure * seen):
                    break
                out[k] = rng.integers(0, len(_WORDS))
        counts[int(out[k])] = counts.get(int(out[k]), 0) + 1
    return out


def _words(rng: np.random.Generator, n_words: int, pressure: float = 0.0,
           counts: dict[int, int] | None = None) -> str:
    idx = rng.integers(0, len(_WORDS), size=n_words)
    ends = rng.random(n_words) < 0.12
    if pressure:
        idx = _pressured(rng, idx, pressure, {} if counts is None else counts)
    out = []
    cap = True
    for i, e in zip(idx.tolist(), ends.tolist()):
        w = _WORDS[i]
        out.append(w.capitalize() if cap else w)
        out.append(". " if e else " ")
        cap = e
    return "".join(out)


def _argument(rng: np.random.Generator, schema: Any) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(schema, dict) and isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][int(rng.integers(len(schema["enum"])))]
    if kind == "integer":
        return int(rng.integers(0, 100))
    if kind == "number":
        return round(float(rng.random() * 100), 2)
    if kind == "boolean":
        return bool(rng.random() < 0.5)
    if kind == "array":
        return [_argument(rng, schema.get("items", {"type": "string"}))]
    if kind == "object":
        return {}
    return _WORDS[int(rng.integers(len(_WORDS)))]


def _tool_call_text(rng: np.random.Generator, tools: list[dict[str, Any]]) -> str:
    fn = tools[int(rng.integers(len(tools)))]
    # The specs are prompt text, which no request checked: a model reads what is there, so a schema that is
    # not one (``"parameters": "x"``) gives a call without arguments rather than an engine failure.
    schema = fn.get("parameters")
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        props = {}
    args = {name: _argument(rng, schema) for name, schema in props.items()}
    lead = _words(rng, int(rng.integers(3, 9))).strip() + "\n" if rng.random() < 0.5 else ""
    body = json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False)
    return f"{lead}{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def _content_ids(tok: Tokenizer, rng: np.random.Generator, n: int, pressure: float = 0.0) -> list[int]:
    # Fixed-size blocks of words, so that a shorter reply is a prefix of a longer one.
    ids: list[int] = []
    counts: dict[int, int] = {}
    while len(ids) < n:
        ids.extend(tok.encode(_words(rng, 64, pressure, counts)))
    return ids[:n]


def _first_stop_str(tok: Tokenizer, ids: np.ndarray, stops: tuple[str, ...], limit: int) -> tuple[int, str] | None:
    """Smallest k <= limit such that the text of ids[:k] contains a stop string."""
    if not stops:
        return None
    text = tok.decode(ids[:limit].tolist(), skip_special_tokens=True)
    if not any(s in text for s in stops):
        return None
    lo, hi = 1, limit
    while lo < hi:  # containment only grows with k, so bisect on it
        mid = (lo + hi) // 2
        if any(s in tok.decode(ids[:mid].tolist(), skip_special_tokens=True) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    text = tok.decode(ids[:lo].tolist(), skip_special_tokens=True)
    matched = min((s for s in stops if s in text), key=lambda s: text.find(s))
    return lo, matched


def wants_reasoning(tok: Tokenizer, prompt: Any) -> bool:
    """The prompt opens an assistant turn in thinking mode: a reply starts with a think block.

    Only for tokenizers whose template has ``<think>`` blocks (Qwen3's), when the prompt ends with
    the bare generation prompt (not with the empty think block that turns thinking off).
    """
    try:
        profile = tok.template_profile
    except Exception:  # a tokenizer without a probe-able template thinks never
        return False
    if not profile.has_reasoning:
        return False
    opener = tok.encode(profile.assistant_open)
    tail = [int(t) for t in prompt[-len(opener):]] if len(prompt) >= len(opener) else []
    return tail == opener


def _reasoning_text(rng: np.random.Generator) -> str:
    return "<think>\n" + _words(rng, int(rng.integers(6, 16))).strip() + "\n</think>\n\n"


def plan_reply(tok: Tokenizer, seed_words: list[int], params: SamplingParams, *,
               mean_tokens: int, tools: list[dict[str, Any]], tool_call_rate: float,
               reasoning: bool = False) -> Draft:
    """Plan one reply for a prompt (whose offered ``tools`` the caller extracted).

    ``seed_words`` identify (engine seed, prompt, temperature, ...). Stop conditions and
    ``max_new_tokens`` only cut the planned stream, as they would cut a real model's samples.
    With ``reasoning`` the reply opens with a ``<think>`` block.
    """
    rng = np.random.default_rng([*seed_words, 0])          # decisions: tool call, reply length
    n_max = params.max_new_tokens
    stop_ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        stop_ids.update(tok.stop_token_ids)
    tool_turn = bool(tools) and rng.random() < tool_call_rate
    length = 1 + int(rng.exponential(mean_tokens))
    head = tok.encode(_reasoning_text(np.random.default_rng([*seed_words, 3]))) if reasoning else []
    if params.json_schema is not None:  # constrained: the whole reply is the document
        doc = sample_json(np.random.default_rng([*seed_words, 4]), params.json_schema, params.json_schema)
        content = tok.encode(json.dumps(doc, ensure_ascii=False))
        ends = not params.ignore_eos
    elif params.ebnf is not None:
        content = tok.encode(params.ebnf.sample(np.random.default_rng([*seed_words, 4])))
        ends = not params.ignore_eos
    elif tool_turn:
        content = head + tok.encode(_tool_call_text(rng, tools))
        ends = True
    else:
        ends = not params.ignore_eos and length <= n_max
        content = _content_ids(tok, np.random.default_rng([*seed_words, 1]), length - 1 if ends else n_max,
                               params.repeat_pressure)
        content = head + content
    ids = np.asarray(content + ([tok.im_end_token_id] if ends else []), dtype=np.int32)
    scale = 0.15 + 0.6 * min(params.temperature, 2.0)
    logprobs = (-np.random.default_rng([*seed_words, 2]).gamma(0.7, scale, size=len(ids))).astype(np.float32)

    # The earliest stop event wins, as a token-by-token scheduler would see it.
    cut, finish, stop_str = min(len(ids), n_max), None, None
    if stop_ids and len(ids):
        hits = np.flatnonzero(np.isin(ids, np.fromiter(stop_ids, dtype=np.int64)))
        hits = hits[hits >= params.min_new_tokens - 1]
        if len(hits) and hits[0] < cut:
            cut = int(hits[0]) + 1
            finish = {"type": "stop", "matched": int(ids[hits[0]])}
    found = _first_stop_str(tok, ids, params.stop, cut)
    if found is not None and (found[0] < cut or finish is None):
        cut, stop_str = found
        finish = {"type": "stop", "matched": stop_str}
    if finish is None:
        finish = {"type": "length", "length": cut}
    return Draft(ids[:cut], logprobs[:cut], finish, stop_str)
