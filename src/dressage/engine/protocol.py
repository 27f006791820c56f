"""SGLang's ``/generate`` request as typed values: parsing and validation of the JSON body.

Keys and defaults follow SGLang's ``GenerateReqInput`` and ``SamplingParams``. Unknown top-level
keys are ignored as SGLang ignores them; unknown sampling parameters are rejected with their name,
because a misspelt one silently changes nothing. So are SGLang parameters this engine cannot honour
(:data:`REFUSED_SAMPLING_PARAMS`): regex / structural-tag constraints, ``logit_bias``, ``n > 1``.
``json_schema`` and ``ebnf`` constraints are honoured.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from typing import Any, Mapping

from dressage.engine.ebnf import Grammar, parse_grammar
from dressage.engine.json_schema import parse_schema
from dressage.errors import EngineRequestError

__all__ = ["SamplingParams", "GenerateRequest", "parse_generate_body", "KNOWN_SAMPLING_PARAMS",
           "REFUSED_SAMPLING_PARAMS"]

# SGLang's sampling parameters. Those in REFUSED_SAMPLING_PARAMS are refused when set; of the rest,
# spaces_between_special_tokens and stream_interval change nothing a reply's tokens depend on.
KNOWN_SAMPLING_PARAMS = frozenset({
    "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids",
    "stop_regex", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "n", "json_schema", "regex", "ebnf",
    "structural_tag", "custom_params", "stream_interval", "logit_bias", "sampling_seed",
})

REFUSED_SAMPLING_PARAMS = {
    "regex": "regex-constrained decoding",
    "structural_tag": "structural-tag constrained decoding", "stop_regex": "regex stop conditions",
    "logit_bias": "logit_bias (its word-level sampler has no per-token logits to bias)",
    "custom_params": "custom logit processors",
}
"""Set (not null) -> 400 from this engine, naming what it lacks; SGLang itself honours them."""


def _bad(msg: str) -> EngineRequestError:
    return EngineRequestError(msg, status_code=400)


def _int(value: Any, key: str, low: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{key} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise _bad(f"{key} must be >= {low}, got {value}")
    return value


def _num(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"{key} must be a number, got {value!r}")
    return float(value)


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(f"{key} must be true or false, got {value!r}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """The sampling parameters that shape this engine's output."""

    max_new_tokens: int
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    top_k: int = -1
    """-1: the whole vocabulary; 1: greedy."""
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    json_schema: dict[str, Any] | None = None
    """The reply is a JSON document of this schema (``json_schema`` arrives as a JSON string)."""
    ebnf: Grammar | None = None
    """The reply is a text of this grammar (SGLang's ``ebnf``)."""
    max_new_tokens_explicit: bool = True
    """False when the request left max_new_tokens out (then the context window clamps it)."""

    @classmethod
    def parse(cls, raw: Any, default_max_new_tokens: int) -> "SamplingParams":
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise _bad(f"sampling_params must be an object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - KNOWN_SAMPLING_PARAMS)
        if unknown:
            raise _bad(f"sampling_params: unknown parameter(s) {', '.join(unknown)}")
        for key, what in REFUSED_SAMPLING_PARAMS.items():
            if raw.get(key) not in (None, {}, [], ""):
                raise _bad(f"sampling_params.{key}: this engine does not support {what}")
        if raw.get("n") not in (None, 1):
            raise _bad("sampling_params.n: this engine answers one sample per request; send n requests")
        get = raw.get
        mnt = get("max_new_tokens")
        stop = get("stop")
        if stop is None:
            stop = ()
        elif isinstance(stop, str):
            stop = (stop,)
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            stop = tuple(s for s in stop if s)
        else:
            raise _bad(f"sampling_params.stop must be a string or a list of strings, got {stop!r}")
        sti = get("stop_token_ids") or []
        if not isinstance(sti, list):
            raise _bad(f"sampling_params.stop_token_ids must be a list of integers, got {sti!r}")
        temperature = _num(get("temperature", 1.0), "sampling_params.temperature")
        top_p = _num(get("top_p", 1.0), "sampling_params.top_p")
        if temperature < 0:
            raise _bad(f"sampling_params.temperature must be >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise _bad(f"sampling_params.top_p must be in (0, 1], got {top_p}")
        seed = get("sampling_seed")
        top_k = _int(-1 if get("top_k") is None else get("top_k"), "sampling_params.top_k")
        if top_k == 0 or top_k < -1:
            raise _bad(f"sampling_params.top_k must be -1 (disable) or at least 1, got {top_k}")
        min_p = _num(get("min_p", 0.0) or 0.0, "sampling_params.min_p")
        if not 0.0 <= min_p <= 1.0:
            raise _bad(f"sampling_params.min_p must be in [0, 1], got {min_p}")
        penalties = {}
        for key in ("frequency_penalty", "presence_penalty"):
            penalties[key] = _num(get(key, 0.0) or 0.0, f"sampling_params.{key}")
            if not -2.0 <= penalties[key] <= 2.0:
                raise _bad(f"sampling_params.{key} must be in [-2, 2], got {penalties[key]}")
        rep = _num(1.0 if get("repetition_penalty") is None else get("repetition_penalty"),
                   "sampling_params.repetition_penalty")
        if not 0.0 < rep <= 2.0 or not math.isfinite(rep):
            raise _bad(f"sampling_params.repetition_penalty must be in (0, 2], got {rep}")
        schema = get("json_schema")
        grammar = get("ebnf")
        if schema is not None and grammar is not None:
            raise _bad("sampling_params: json_schema and ebnf are both set; give one constraint")
        return cls(
            max_new_tokens=default_max_new_tokens if mnt is None else _int(mnt, "sampling_params.max_new_tokens", 0),
            min_new_tokens=_int(get("min_new_tokens", 0), "sampling_params.min_new_tokens", 0),
            temperature=temperature,
            top_p=top_p,
            stop=stop,
            stop_token_ids=tuple(_int(t, "sampling_params.stop_token_ids[]", 0) for t in sti),
            ignore_eos=_bool(get("ignore_eos", False), "sampling_params.ignore_eos"),
            skip_special_tokens=_bool(get("skip_special_tokens", True), "sampling_params.skip_special_tokens"),
            no_stop_trim=_bool(get("no_stop_trim", False), "sampling_params.no_stop_trim"),
            sampling_seed=None if seed is None else _int(seed, "sampling_params.sampling_seed"),
            top_k=top_k, min_p=min_p, repetition_penalty=rep, **penalties,
            json_schema=None if schema is None else parse_schema(schema),
            ebnf=None if grammar is None else parse_grammar(grammar),
            max_new_tokens_explicit=mnt is not None,
        )

    @property
    def greedy(self) -> bool:
        """Temperature 0 or top_k 1 (as SGLang reads them): the seed changes nothing."""
        return self.temperature < 1e-6 or self.top_k == 1

    @property
    def repeat_pressure(self) -> float:
        """How strongly repeats are discouraged (> 0) or favoured (< 0): presence + frequency +
        ln(repetition_penalty), the sampler's analogue of the three penalties."""
        return self.presence_penalty + self.frequency_penalty + math.log(self.repetition_penalty)

    def digest_key(self) -> tuple:
        """The values that change what is sampled; stop conditions and lengths only cut it."""
        base = (0.0, 1.0, None) if self.greedy else (round(self.temperature, 6), round(self.top_p, 6),
                                                     self.sampling_seed)
        extra = (self.top_k if not self.greedy else -1, round(self.min_p, 6), round(self.frequency_penalty, 6),
                 round(self.presence_penalty, 6), round(self.repetition_penalty, 6))
        if extra == (-1, 0.0, 0.0, 0.0, 1.0) and self.json_schema is None and self.ebnf is None:
            return base  # the key (so every reply) of a request without them is unchanged
        schema = None if self.json_schema is None else json.dumps(self.json_schema, sort_keys=True)
        return base + extra + (schema,) + (() if self.ebnf is None else (self.ebnf.source,))


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateRequest:
    """One prompt of a ``/generate`` call (a batch call holds several)."""

    rid: str
    input_ids: tuple[int, ...] | None
    text: str | None
    sampling: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0
    stream: bool = False
    top_logprobs_num: int = 0
    """Alternatives per output token in ``meta_info.output_top_logprobs`` (with return_logprob)."""


def _ids(value: Any, key: str, vocab_size: int) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise _bad(f"{key} must be a list of token ids")
    for i, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise _bad(f"{key}[{i}] = {t!r} is not a token id in [0, {vocab_size})")
    return tuple(value)


def _per_item(value: Any, n: int, key: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != n:
            raise _bad(f"{key} has {len(value)} entries for a batch of {n}")
        return value
    return [value] * n


def parse_generate_body(body: Any, *, vocab_size: int, default_max_new_tokens: int) -> tuple[list[GenerateRequest], bool]:
    """The requests of one ``/generate`` body, and whether it was a batch (list answer)."""
    if not isinstance(body, Mapping):
        raise _bad("the /generate body must be a JSON object")
    ids, text = body.get("input_ids"), body.get("text")
    if (ids is None) == (text is None):
        raise _bad("exactly one of input_ids or text must be given")
    if ids is not None:
        batch = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        prompts = [(_ids(p, f"input_ids[{i}]" if batch else "input_ids", vocab_size), None)
                   for i, p in enumerate(ids if batch else [ids])]
    else:
        batch = isinstance(text, list)
        texts = text if batch else [text]
        if not all(isinstance(t, str) for t in texts):
            raise _bad("text must be a string or a list of strings")
        prompts = [(None, t) for t in texts]
    if not prompts:
        raise _bad("empty batch")
    n = len(prompts)
    sps = _per_item(body.get("sampling_params"), n, "sampling_params")
    rids = _per_item(body.get("rid"), n, "rid")
    flags = {}
    for key in ("return_logprob", "return_text_in_logprobs", "return_routed_experts", "stream"):
        value = body.get(key, False)
        flags[key] = _per_item(False if value is None else value, n, key)
    lsl = _per_item(body.get("logprob_start_len", -1), n, "logprob_start_len")
    rsl = _per_item(body.get("routed_experts_start_len", 0), n, "routed_experts_start_len")
    tln = _per_item(body.get("top_logprobs_num", 0), n, "top_logprobs_num")
    out = []
    for i, (p_ids, p_text) in enumerate(prompts):
        rid = rids[i]
        if rid is not None and not isinstance(rid, str):
            raise _bad(f"rid must be a string, got {rid!r}")
        out.append(GenerateRequest(
            rid=rid or uuid.uuid4().hex,
            input_ids=p_ids,
            text=p_text,
            sampling=SamplingParams.parse(sps[i], default_max_new_tokens),
            return_logprob=_bool(flags["return_logprob"][i], "return_logprob"),
            logprob_start_len=_int(-1 if lsl[i] is None else lsl[i], "logprob_start_len", -1),
            return_text_in_logprobs=_bool(flags["return_text_in_logprobs"][i], "return_text_in_logprobs"),
            return_routed_experts=_bool(flags["return_routed_experts"][i], "return_routed_experts"),
            routed_experts_start_len=_int(0 if rsl[i] is None else rsl[i], "routed_experts_start_len", 0),
            stream=_bool(flags["stream"][i], "stream"),
            top_logprobs_num=_int(0 if tln[i] is None else tln[i], "top_logprobs_num", 0),
        ))
    if batch and any(r.stream for r in out):
        raise _bad("stream is not supported for a batch of prompts by this engine; send them one by one")
    return out, batch
