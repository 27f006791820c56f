"""One model call as engine requests: generate, be cut by a pause, resume, merge into one response.

A pause aborts the engine request at a token boundary; after resume the call re-issues
``/generate`` with input = prompt + the output so far and ``routed_experts_start_len`` where the
held routing ends. The chunks merge (``PartialResponse``) into one response with per-token versions:
each chunk carries the engine's own ``meta_info.weight_version`` when it reports one.

An abort that reached the request while it still waited in the engine's queue answers without
routing (and, streamed, with only the last id): that cut keeps what it can (nothing with R3 on)
and the call resumes from there like any other cut.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import numpy as np

from dressage.errors import EngineError, EngineTimeout, EngineUnavailable, GenerationPreemptedError, WireFormatError
from dressage.fields.sglang import finish_type, is_queued_abort
from dressage.proxy.engines import server_timing
from dressage.proxy.recording.pause import RolloutPause
from dressage.proxy.engines.rids import chunk_rid
from dressage.trajectory import PartialResponse, RouteDecision

__all__ = ["GenerationPlan", "GenerationResult", "run_generation", "KEEPALIVE_S"]

KEEPALIVE_S = 10.0


@dataclass(slots=True)
class GenerationPlan:
    """What to generate: the prompt, where it attaches, sampling, the engine and its flags."""

    rid: str
    prompt_ids: np.ndarray
    decision: RouteDecision
    sampling: dict[str, Any]
    client: Any
    params: dict[str, Any]
    """``core.generate_params(decision)``: return_logprob / return_routed_experts / start row."""
    stream: bool = False
    routing_key: str | None = None
    """Sent as ``X-SMG-Routing-Key`` (the session id) so a gateway keeps the session's prefix cache."""
    session_id: str | None = None
    instance_id: str | None = None
    """The call's session and prompt instance: a pause scoped to either cuts and holds this call."""
    routed_experts_spec: Any = None
    """:meth:`ProxyCore.routed_experts_spec` with R3 on: the engine client decodes each answer's routing
    straight into the storage dtype (as a buffered body arrives, :meth:`SGLangClient.generate`) and
    hands it up as an array."""


@dataclass(slots=True)
class GenerationResult:
    response_ids: np.ndarray
    logprobs: np.ndarray | None
    routed_experts: np.ndarray | None
    token_versions: np.ndarray
    finish_reason: str | None
    chunks: int
    """Engine requests the response took (1 unless a pause cut it)."""
    dropped_tokens: int = 0
    """Tokens of cut answers that came without routing and were generated again."""
    top_logprobs: list[Any] | None = None
    """SGLang's ``output_top_logprobs`` per response token, when the call asked ``top_logprobs_num``."""


class _StreamedAnswer:
    """One ``/generate`` answer rebuilt from its streamed chunks (cumulative or incremental)."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.entries: list[Any] = []
        self.top: list[Any] = []
        self.meta: dict[str, Any] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("meta_info", {}), dict) \
                or not isinstance(chunk.get("output_ids", []), list):
            raise WireFormatError(f"the engine sent a stream chunk that is not SGLang's format: {str(chunk)[:200]}")
        out = chunk.get("output_ids") or []
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**31 for t in out):
            raise WireFormatError("the engine sent a stream chunk whose output_ids are not token ids")
        self.meta = chunk.get("meta_info") or {}
        if is_queued_abort(self.meta):
            # Its ids are only the last one (or none) and its logprobs are not this stream's:
            # keep what the earlier chunks gave if they add up to the engine's count, else nothing.
            if self.meta.get("completion_tokens", len(self.ids)) != len(self.ids):
                self.ids, self.entries, self.top = [], [], []
            return
        lps = self.meta.get("output_token_logprobs") or []
        if not isinstance(lps, list):
            raise WireFormatError("the engine sent a stream chunk whose output_token_logprobs is not a list")
        top = self.meta.get("output_top_logprobs") or []
        total = self.meta.get("completion_tokens")
        if isinstance(total, int) and len(out) == total:
            self.ids, self.entries, self.top = list(out), list(lps), list(top)  # cumulative (SGLang's default)
        else:
            self.ids.extend(out)
            self.entries.extend(lps)
            self.top.extend(top)

    def body(self) -> dict[str, Any]:
        if finish_type(self.meta) is None:
            raise WireFormatError("the engine's stream ended without a finished chunk")
        meta = {**self.meta, "output_token_logprobs": self.entries}
        if self.top:
            meta["output_top_logprobs"] = self.top
        return {"output_ids": self.ids, "meta_info": meta}


class _IncrementalText:
    """The decoded text of a growing id list, decoding only a short window per step.

    Each step decodes the ids since the previous step's start, so tokenizers that render a token
    by its left context (leading spaces) and byte-level ids split inside one character come out as
    a full decode would; a tail that ends in a replacement character waits for its next bytes.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.text = ""
        self._prefix = self._read = 0

    def extend_to(self, ids: list[int]) -> str:
        self.ids.extend(ids[len(self.ids):])
        before = self.decode(self.ids[self._prefix:self._read])
        after = self.decode(self.ids[self._prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before):]
            self._prefix, self._read = self._read, len(self.ids)
        return self.text


async def run_generation(plan: GenerationPlan, pause: RolloutPause, normalize: Callable[..., Any], *,
                         partial_rollout: bool, timeout_s: float,
                         decode: Callable[[list[int]], str]) -> AsyncIterator[str | GenerationResult | None]:
    """Yield the decoded reply text after each streamed chunk, then the :class:`GenerationResult`.

    ``None`` is a keep-alive while a streamed call waits for resume.

    ``normalize(body, prompt_len=, decision=)`` is the core's response decoder (it checks every
    length). Raises :class:`GenerationPreemptedError` when a pause cuts the call and partial
    rollout is off; nothing is recorded here.
    """
    prompt = plan.prompt_ids
    partial = PartialResponse(len(prompt), plan.decision.routed_experts_start)
    so_far: list[int] = []
    # None: the call sent no max_new_tokens (the engine's default applies to each piece of it).
    budget = plan.sampling.get("max_new_tokens")
    finish: str | None = None
    chunk_no = dropped = 0
    want_top = bool(plan.params.get("top_logprobs_num"))
    top: list[Any] = []
    text = _IncrementalText(decode)
    call_kw: dict[str, Any] = {} if plan.routing_key is None else {"routing_key": plan.routing_key}
    if plan.routed_experts_spec is not None:
        call_kw["routed_experts_spec"] = plan.routed_experts_spec
    while True:
        # A streamed call waiting out a weight update sends keep-alives (None) so that neither the
        # agent nor a proxy in between times the quiet connection out.
        while not await pause.wait_running(KEEPALIVE_S if plan.stream else None, session_id=plan.session_id,
                                           instance_id=plan.instance_id):
            yield None
        version = pause.versions.current  # the fallback when the engine reports no version
        start = partial.next_routed_experts_start
        params = dict(plan.params)
        if "routed_experts_start_len" in params:
            params["routed_experts_start_len"] = start
        sampling = dict(plan.sampling) if budget is None else dict(plan.sampling, max_new_tokens=budget - len(so_far))
        # An array: the request's JSON is written from it (a list of up to 8K Python ints otherwise).
        input_ids = prompt if not so_far else np.concatenate([prompt, np.asarray(so_far, dtype=prompt.dtype)])
        rid = chunk_rid(plan.rid, chunk_no)
        async with pause.track(rid, plan.client, session_id=plan.session_id, instance_id=plan.instance_id) as run:
            try:
                if plan.stream:
                    answer = _StreamedAnswer()
                    with server_timing.engine_wait():  # the agent reads as the engine writes: one wait
                        async for chunk in plan.client.generate_stream(input_ids, sampling, rid=rid, **call_kw,
                                                                         **params):
                            answer.add(chunk)
                            yield text.extend_to(so_far + answer.ids)
                    body = answer.body()
                    answer = chunk = None  # the last chunk's meta holds the routing too
                else:
                    # In this task (no wrapper task per call, which would hold the engine's body
                    # as its result until collected).
                    with server_timing.engine_wait():
                        body = await _within(timeout_s, plan.client.generate(input_ids, sampling, rid=rid,
                                                                             **call_kw, **params))
            except asyncio.TimeoutError:
                raise EngineTimeout(f"the engine did not answer within {timeout_s} s") from None
            except (asyncio.CancelledError, GeneratorExit):
                # The agent went away: stop the engine too (best effort, nothing is recorded).
                _abort_later(plan.client, rid)
                raise
        decision = dataclasses.replace(plan.decision, routed_experts_start=start)
        out = normalize(body, prompt_len=len(input_ids), decision=decision)
        body = None  # the engine's answer is normalised: hold only the arrays from here on
        aborted = out.finish_reason == "abort"
        if aborted and not run.aborted:
            raise EngineUnavailable(f"the engine aborted request {rid} (not a pause of this Proxy)")
        if aborted and not partial_rollout:
            raise GenerationPreemptedError(
                "a weight update paused this generation and partial rollout is off: its tokens would mix "
                "policy versions; the call is dropped (start the Proxy with --partial-rollout to resume it)")
        version = pause.versions.stamp(getattr(out, "weight_version", None), version)
        dropped += getattr(out, "dropped_tokens", 0)
        if len(out.output_ids):
            if want_top:
                top.extend(_top_entries(out, len(out.output_ids)))
            partial.add_chunk(out.output_ids, out.logprobs, out.routed_experts, version=version)
            so_far.extend(out.output_ids.tolist())
        chunk_no += 1
        if not aborted:
            finish = out.finish_reason
            break
        if budget is not None and len(so_far) >= budget:
            finish = "length"
            break
    out = None  # its meta still references the engine's answer (and its routing)
    ids, lps, routed, versions = partial.merge()
    yield GenerationResult(ids, lps, routed, versions, finish, chunk_no, dropped, top if want_top else None)


async def _within(timeout_s: float | None, call: Any) -> Any:
    """``await call`` with a deadline, in the calling task where Python has ``asyncio.timeout``."""
    if _TIMEOUT is None:
        return await asyncio.wait_for(call, timeout=timeout_s)
    async with _TIMEOUT(timeout_s):
        return await call


_TIMEOUT = getattr(asyncio, "timeout", None)  # Python >= 3.11


def _top_entries(out: Any, n: int) -> list[Any]:
    meta = getattr(out, "meta_info", None) or {}
    top = meta.get("output_top_logprobs")
    if not isinstance(top, list) or len(top) != n:
        got = len(top) if isinstance(top, list) else "no"
        raise WireFormatError(f"meta_info.output_top_logprobs has {got} entries for {n} output tokens "
                              "(was top_logprobs_num sent with return_logprob?)")
    return top


def _abort_later(client: Any, rid: str) -> None:
    try:
        asyncio.get_running_loop().create_task(_abort_quietly(client, rid))
    except RuntimeError:
        pass  # no loop any more (interpreter shutting down): the engine times the request out


async def _abort_quietly(client: Any, rid: str) -> None:
    try:
        await client.abort(rid)
    except EngineError:
        pass  # best effort: the engine may be gone as well
