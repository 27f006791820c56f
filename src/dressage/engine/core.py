"""The engine proper: plan a reply for a prompt, then answer in SGLang's ``/generate`` JSON.

No weights and no GPU: replies come from a seeded generator, routing from prefix hashes
(:mod:`dressage.engine.routing`). A bounded prefix cache of block hashes reports
``cached_tokens`` the way SGLang's radix cache does, for prompts that extend earlier sequences.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from dressage.engine.config import EngineConfig
from dressage.engine.protocol import GenerateRequest, parse_generate_body
from dressage.engine.routing import RoutingModel, splitmix64
from dressage.engine.sampling import Draft, ends_with_tool_results, offered_tools, plan_reply, wants_reasoning
from dressage.errors import EngineRequestError
from dressage.fields.sglang import encode_routed_experts_b64
from dressage.tokenizer import Tokenizer, load_tokenizer

__all__ = ["Engine", "Generation"]


@dataclass(slots=True)
class Generation:
    """A planned reply for one request, emitted token by token by the server."""

    request: GenerateRequest
    prompt: np.ndarray          # int32 [P]
    draft: Draft
    cached_tokens: int
    started: float              # time.perf_counter() at arrival
    routed: np.ndarray | None = None
    """Top-k expert ids of every position of prompt + reply but the last ([P+R-1, layers, topk]),
    from a real model's forward pass; ``None``: derived from prefix hashes."""

    @property
    def num_tokens(self) -> int:
        return len(self.draft.ids)


class Engine:
    """Stateless apart from the prefix cache and the weight version; one per server."""

    def __init__(self, config: EngineConfig, tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer or load_tokenizer(config.tokenizer)
        self.routing = RoutingModel(config.model, config.seed)
        self.weight_version = config.weight_version
        self._cache: OrderedDict[int, None] = OrderedDict()

    @property
    def vocab_size(self) -> int:
        """Accepted input ids: the tokenizer's, or the model's when that is larger."""
        return max(self.tokenizer.vocab_size, self.config.model.vocab_size)

    def parse(self, body: Any) -> tuple[list[GenerateRequest], bool]:
        return parse_generate_body(body, vocab_size=self.vocab_size,
                                   default_max_new_tokens=self.config.default_max_new_tokens)

    # -- planning ------------------------------------------------------------------------------

    def start(self, req: GenerateRequest) -> Generation:
        """Plan the whole reply for ``req`` (raises :class:`EngineRequestError` on a bad prompt)."""
        started = time.perf_counter()
        ids = req.input_ids if req.input_ids is not None else tuple(self.tokenizer.encode(req.text or ""))
        prompt = np.asarray(ids, dtype=np.int32)
        p = len(prompt)
        if p == 0:
            raise EngineRequestError("the prompt is empty", status_code=400)
        ctx, sp = self.config.context_length, req.sampling
        # SGLang's checks and wording: the prompt alone, then prompt + an explicit max_new_tokens.
        if p >= ctx:
            raise EngineRequestError(
                f"The input ({p} tokens) is longer than the model's context length ({ctx} tokens).", status_code=400)
        if sp.max_new_tokens_explicit and p + sp.max_new_tokens >= ctx:
            raise EngineRequestError(
                f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
                f"You requested a total of {p + sp.max_new_tokens} tokens: {p} tokens from the input "
                f"messages and {sp.max_new_tokens} tokens for the completion. Please reduce the number of "
                "tokens in the input messages or the completion to fit within the limit.", status_code=400)
        if not sp.max_new_tokens_explicit and p + sp.max_new_tokens >= ctx:
            req = dataclasses.replace(req, sampling=dataclasses.replace(sp, max_new_tokens=ctx - p - 1))
        if req.return_routed_experts and req.routed_experts_start_len > p - 1:
            raise EngineRequestError(
                f"routed_experts_start_len {req.routed_experts_start_len} must be < the prompt length {p}",
                status_code=400)
        hashes = self.routing.prefix_hashes(prompt)
        tools: list[dict[str, Any]] = []
        if self.config.tool_call_rate > 0:
            known = prompt[prompt < self.tokenizer.vocab_size]
            text = self.tokenizer.decode(known.tolist())
            tools = offered_tools(text)
            if tools and self.config.answer_tool_results and ends_with_tool_results(text):
                tools = []
        draft = plan_reply(self.tokenizer, self._seed_words(hashes[-1], p, req), req.sampling, mean_tokens=self.config.mean_response_tokens,
                           tools=tools, tool_call_rate=self.config.tool_call_rate,
                           reasoning=wants_reasoning(self.tokenizer, prompt))
        return Generation(req, prompt, draft, self._cached_prefix(hashes), started)

    def _seed_words(self, last_hash: np.uint64, p: int, req: GenerateRequest) -> list[int]:
        digest = hashlib.blake2b(repr(req.sampling.digest_key()).encode(), digest_size=8).digest()
        h = int(last_hash)
        return [self.config.seed, h & 0xFFFFFFFF, h >> 32, p, int.from_bytes(digest, "little")]

    # -- prefix cache --------------------------------------------------------------------------

    def _cached_prefix(self, hashes: np.ndarray) -> int:
        block = self.config.prefix_cache_block
        # The last prompt token is always computed (its logits give the first output token).
        usable = (len(hashes) - 1) // block
        if not usable or not self._cache:
            return 0
        ends = hashes[block - 1: usable * block: block].tolist()
        for k in range(len(ends), 0, -1):
            if ends[k - 1] in self._cache:
                return k * block
        return 0

    def _remember(self, hashes: np.ndarray) -> None:
        cap, block = self.config.prefix_cache_blocks, self.config.prefix_cache_block
        if not cap:
            return
        cache = self._cache
        for h in hashes[block - 1::block].tolist():
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > cap:
            cache.popitem(last=False)

    def flush_cache(self) -> None:
        self._cache.clear()

    # -- answers -------------------------------------------------------------------------------

    def _logprob_entries(self, lps: np.ndarray, ids: np.ndarray, with_text: bool) -> list[list[Any]]:
        if with_text:
            dec = self.tokenizer.decode
            return [[lp, t, dec([t])] for lp, t in zip(lps.tolist(), ids.tolist())]
        return [[lp, t, None] for lp, t in zip(lps.tolist(), ids.tolist())]

    def _top_logprobs(self, gen: Generation, since: int, n: int) -> list[list[list[Any]]]:
        """``output_top_logprobs`` of tokens ``since..n``: per token the k most likely ids, best first.

        The sampled token is one of them with its own logprob; the others share what probability it
        leaves (halving each), so every list is a distribution's head and sums to at most 1.
        """
        k = gen.request.top_logprobs_num
        vocab = self.tokenizer.vocab_size
        dec = self.tokenizer.decode if gen.request.return_text_in_logprobs else None
        out = []
        for pos in range(since, n):
            t, lp = int(gen.draft.ids[pos]), float(gen.draft.logprobs[pos])
            rng = np.random.default_rng([self.config.seed, len(gen.prompt), pos, t])
            others = [o for o in dict.fromkeys(int(o) for o in rng.integers(0, vocab, size=2 * k + 2)) if o != t]
            others = others[:k - 1]
            rest = max(1.0 - float(np.exp(lp)), 1e-12)
            cands = [(lp, t)] + [(float(np.log(rest * 0.5 ** (j + 1))), o) for j, o in enumerate(others)]
            cands.sort(key=lambda c: -c[0])
            out.append([[c[0], c[1], dec([c[1]]) if dec else None] for c in cands])
        return out

    def _input_logprobs(self, gen: Generation, hashes: np.ndarray) -> list[list[Any]]:
        start = gen.request.logprob_start_len
        p = len(gen.prompt)
        # A prompt token's logprob is scored from the prefix before it; the first has none.
        mixed = splitmix64(hashes[max(start, 1) - 1:p - 1])
        lps = (-(mixed >> np.uint64(40)).astype(np.float64) / float(1 << 24) * 6.0).astype(np.float32)
        entries = self._logprob_entries(lps, gen.prompt[max(start, 1):], gen.request.return_text_in_logprobs)
        return ([[None, int(gen.prompt[0]), None]] if start == 0 else []) + entries

    def _text(self, gen: Generation, ids: np.ndarray, final: bool) -> str:
        sp = gen.request.sampling
        text = self.tokenizer.decode(ids.tolist(), skip_special_tokens=sp.skip_special_tokens)
        stop = gen.draft.stop_str
        if final and stop and not sp.no_stop_trim:
            at = text.find(stop)
            text = text if at < 0 else text[:at]
        return text

    def chunk(self, gen: Generation, n: int, since: int = 0) -> dict[str, Any]:
        """A streamed, unfinished chunk after ``n`` tokens (tokens ``since..n`` when incremental)."""
        ids, lps = gen.draft.ids[since:n], gen.draft.logprobs[since:n]
        req = gen.request
        meta: dict[str, Any] = {"id": req.rid, "finish_reason": None, "prompt_tokens": len(gen.prompt),
                                "weight_version": self.weight_version, "completion_tokens": n,
                                "cached_tokens": gen.cached_tokens}
        if req.return_logprob:
            meta["output_token_logprobs"] = self._logprob_entries(lps, ids, req.return_text_in_logprobs)
            if req.top_logprobs_num:
                meta["output_top_logprobs"] = self._top_logprobs(gen, since, n)
        return {"text": self._text(gen, ids, False), "output_ids": ids.tolist(), "meta_info": meta}

    def finish(self, gen: Generation, n: int, *, aborted: bool = False, since: int = 0) -> dict[str, Any]:
        """The final answer after ``n`` emitted tokens; ``aborted`` marks a cut by /abort_request."""
        req, d = gen.request, gen.draft
        ids_all = d.ids[:n]
        full = np.concatenate((gen.prompt, ids_all))
        hashes = self.routing.prefix_hashes(full)
        self._remember(hashes)
        aborted = aborted and n < gen.num_tokens
        finish = {"type": "abort", "message": "Abort in running state."} if aborted else d.finish_reason
        ids, lps = ids_all[since:], d.logprobs[since:n]
        meta: dict[str, Any] = {"id": req.rid, "finish_reason": finish, "prompt_tokens": len(gen.prompt),
                                "weight_version": self.weight_version}
        if req.return_logprob:
            meta["output_token_logprobs"] = self._logprob_entries(lps, ids, req.return_text_in_logprobs)
            if req.top_logprobs_num:
                meta["output_top_logprobs"] = self._top_logprobs(gen, since, n)
            if req.logprob_start_len >= 0:
                meta["input_token_logprobs"] = self._input_logprobs(gen, hashes)
        meta["completion_tokens"] = n
        meta["cached_tokens"] = gen.cached_tokens
        if req.return_routed_experts:
            if gen.routed is not None:  # causal: the first P+n-1 rows do not depend on later tokens
                rows = np.ascontiguousarray(gen.routed[req.routed_experts_start_len:len(full) - 1])
            else:
                rows = self.routing.routed_experts(hashes, req.routed_experts_start_len, len(full) - 1)
            meta["routed_experts"] = encode_routed_experts_b64(rows)
        meta["e2e_latency"] = time.perf_counter() - gen.started
        return {"text": self._text(gen, ids, not aborted), "output_ids": ids.tolist(), "meta_info": meta}

    def model_info(self) -> dict[str, Any]:
        m = self.config.model
        return {"model_path": self.config.model_name, "tokenizer_path": self.config.tokenizer,
                "is_generation": True, "preferred_sampling_params": None, "weight_version": self.weight_version,
                # Not in SGLang's answer (it reads these from the HF config); R3 decoding needs them.
                "num_hidden_layers": m.num_layers, "num_experts_per_tok": m.topk, "num_experts": m.num_experts,
                "vocab_size": self.vocab_size}
