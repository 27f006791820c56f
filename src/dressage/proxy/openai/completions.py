"""Legacy text completions (``POST /v1/completions``).

A text completion is a token-level call of its session, like ``/generate``: the prompt (a string,
tokenized without a chat template, or token ids) goes to the engine as it is and the reply is
recorded as one StepRecord. A stop string ends the returned text (it is not part of it) as
OpenAI answers; the recorded tokens are those the engine produced.
"""

from __future__ import annotations

import secrets
import time
from typing import Annotated, Any, AsyncIterator, Optional, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from dressage.errors import DressageError, UnsupportedParameterError
from dressage.proxy.config import ProxyConfig
from dressage.proxy.engine_params import name_client_param
from dressage.proxy.openai.chat.params import _logit_bias
from dressage.proxy.openai.chat.reply import cut_at_stop, visible_prefix
from dressage.proxy.openai.model_calls import ModelCalls
from dressage.proxy.openai.policy import IGNORED, REFUSED, USED, Param, ParamPolicy, request_fields
from dressage.proxy.openai.streaming import DONE, KEEPALIVE, error_payload, opened, sse
from dressage.proxy.recording.lifecycle import InFlight
from dressage.proxy.recording.limits import CallLimits
from dressage.proxy.recording.session_book import SessionBook
from dressage.proxy.schemas import Flag, Integer, Number, Shallow, check_stream_options

__all__ = ["COMPLETIONS_PARAMS", "CompletionRequest", "CompletionsServing"]


def _one_sample(value: Any) -> str | None:
    return None if value == 1 else "one sample per text completion (chat completions take n)"


COMPLETIONS_PARAMS = ParamPolicy("text completions", (
    Param("prompt", USED, "one string (tokenized without a chat template) or one list of token ids; several "
          "prompts: 400"),
    Param("model", USED, "accepted; the one served model answers (its name is reported back)"),
    Param("max_tokens", USED, "engine `max_new_tokens`; left out: what the context window leaves (or "
          "`--default-max-tokens`)"),
    Param("temperature", USED, "engine `temperature`"),
    Param("top_p", USED, "engine `top_p`"),
    Param("presence_penalty", USED, "engine `presence_penalty`"),
    Param("frequency_penalty", USED, "engine `frequency_penalty`"),
    Param("logit_bias", USED, "engine `logit_bias` (token id -> bias in -100..100)"),
    Param("stop", USED, "engine `stop` (up to 4); the text ends before the stop string"),
    Param("seed", USED, "engine `sampling_seed`"),
    Param("logprobs", USED, "0..5: each token's logprob and that many alternatives"),
    Param("stream", USED, "OpenAI chunks"),
    Param("stream_options", USED, "`include_usage`: a last chunk with the usage"),
    Param("n", USED, "1 only; more: 400 (one sample per text completion)", _one_sample),
    Param("best_of", USED, "1 only; more: 400", lambda v: None if v == 1 else "only one candidate is drawn"),
    Param("user", IGNORED, "accepted and ignored: OpenAI platform bookkeeping, it does not change what is "
          "sampled"),
    Param("echo", IGNORED, "`false` accepted; `true`: 400", lambda v: "echoing the prompt is not supported" if v
          else None),
    Param("suffix", REFUSED, "insertion (a suffix after the completion) is not supported"),
))
"""What a text-completions call does with each field (``docs/parameters.md`` renders it)."""


class CompletionRequest(BaseModel):
    """``POST /v1/completions`` body; every field, declared here or not, is checked by :data:`COMPLETIONS_PARAMS`."""

    model_config = ConfigDict(extra="allow")

    model: Optional[str] = None
    prompt: Union[str, list[Integer], list[str], list[list[Integer]]]
    max_tokens: Optional[Integer] = Field(default=None, ge=1)
    temperature: Optional[Number] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[Number] = Field(default=None, gt=0.0, le=1.0)
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[Integer] = None
    stream: Flag = False
    stream_options: Annotated[Optional[dict[str, Any]], Shallow] = None
    logprobs: Optional[Integer] = Field(default=None, ge=0, le=5)
    """Alternatives per token (OpenAI allows up to 5); each token's own logprob comes with any value."""
    n: Integer = Field(default=1, ge=1)
    best_of: Optional[Integer] = Field(default=None, ge=1)
    echo: Flag = False
    suffix: Optional[str] = None
    presence_penalty: Optional[Number] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[Number] = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[str, Number]] = None

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        return check_stream_options(v)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and isinstance(v[0], int) and any(t < 0 or t > 2**31 - 1 for t in v):
            raise ValueError("token ids must be in 0..2**31-1")
        return v


def _one_prompt(prompt: Any) -> Union[str, list[int]]:
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return prompt
    if len(prompt) != 1:
        raise UnsupportedParameterError("prompt", f"holds {len(prompt)} prompts; send one prompt per request "
                                                  f"(each call is one step of its session)")
    return prompt[0]


class CompletionsServing:
    """The text-completion use case of one Proxy: a token-level call through ``calls``."""

    def __init__(self, config: ProxyConfig, tokenizer: Any, *, calls: ModelCalls, limits: CallLimits,
                 in_flight: InFlight, book: SessionBook) -> None:
        self.config, self.tokenizer = config, tokenizer
        self.calls, self.limits, self.in_flight, self.book = calls, limits, in_flight, book

    def _completion_sampling(self, req: CompletionRequest, prompt_len: int) -> tuple[dict[str, Any], list[str]]:
        COMPLETIONS_PARAMS.check(request_fields(req))
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stops) > 4 or not all(stops):
            raise UnsupportedParameterError("stop", "at most 4 stop sequences, none empty")
        sp: dict[str, Any] = {**self.limits.sampling(req.max_tokens, prompt_len),
                              "stop_token_ids": list(self.tokenizer.stop_token_ids)}
        for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
            if getattr(req, name) is not None:
                sp[name] = getattr(req, name)
        if req.logit_bias:
            sp["logit_bias"] = _logit_bias(req.logit_bias)
        if stops:
            sp["stop"] = stops
        if req.seed is not None:
            sp["sampling_seed"] = req.seed
        return sp, stops

    def _prepare_completion(self, session_id: str, req: CompletionRequest) -> tuple[Any, str, list[str]]:
        self.calls.admit(session_id)
        prompt = _one_prompt(req.prompt)
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise UnsupportedParameterError("prompt", "the prompt has no tokens")
        prompt_ids = np.asarray(ids, dtype=np.int32)
        sp, stops = self._completion_sampling(req, len(prompt_ids))
        plan, url = self.calls.plan(session_id, prompt_ids, sp, stream=req.stream)
        if req.logprobs:
            plan.params["top_logprobs_num"] = req.logprobs
        return plan, url, stops

    def _logprobs(self, ids: list[int], result: Any, text: str, stopped: bool, want: int) -> dict[str, Any]:
        """OpenAI's legacy ``logprobs``: tokens, their logprobs and offsets, ``want`` alternatives each."""
        decode = self.tokenizer.decode
        tokens = [decode([t]) for t in ids]
        values = [float(x) for x in result.logprobs] if result.logprobs is not None else [None] * len(ids)
        offsets, pos = [], 0
        for tok in tokens:
            offsets.append(pos)
            pos += len(tok)
        keep = sum(1 for o in offsets if o < len(text)) if stopped else len(ids)  # not the stop sequence's tokens
        top = None
        if want:
            alts = result.top_logprobs or [[] for _ in ids]
            top = [{decode([int(a[1])]): float(a[0]) for a in (alts[i] or [])[:want]} for i in range(keep)]
        return {"tokens": tokens[:keep], "token_logprobs": values[:keep], "text_offset": offsets[:keep],
                "top_logprobs": top}

    async def _record_completion(self, session_id: str, plan: Any, url: str, result: Any, stops: list[str],
                                 req: CompletionRequest, completion_id: str, created: int) -> dict[str, Any]:
        self.calls.check_generated(session_id, [result])
        step = await self.calls.record(session_id, plan, result, url, metadata={"finish_reason": result.finish_reason})
        ids = step.response_ids.tolist()
        text, stopped = cut_at_stop(self.tokenizer.decode(ids, skip_special_tokens=True), stops)
        finish = "length" if result.finish_reason == "length" and not stopped else "stop"
        choice = {"index": 0, "text": text, "finish_reason": finish,
                  "logprobs": None if req.logprobs is None else self._logprobs(ids, result, text, stopped,
                                                                              req.logprobs)}
        return {"id": completion_id, "object": "text_completion", "created": created,
                "model": self.config.server.served_model_name, "choices": [choice],
                "usage": {"prompt_tokens": step.prompt_len, "completion_tokens": step.response_len,
                          "total_tokens": step.seq_len}}

    async def open(self, session_id: str, req: CompletionRequest) -> dict[str, Any] | AsyncIterator[bytes]:
        """A text completion (dict) or, for ``stream``, its SSE stream; every 4xx is raised before generation.
        A call that fails (or is cancelled: its agent hung up) before its recording began records nothing, and
        a header session it created is not kept."""
        try:
            return await self._open(session_id, req)
        except BaseException as exc:
            self.book.drop_if_unused(session_id)
            if isinstance(exc, DressageError):
                name_client_param(exc, "completions", req.model_fields_set)  # an engine's refusal names our field
            raise

    async def _open(self, session_id: str, req: CompletionRequest) -> dict[str, Any] | AsyncIterator[bytes]:
        plan, url, stops = self._prepare_completion(session_id, req)
        completion_id, created = f"cmpl-{secrets.token_hex(12)}", int(time.time())
        if req.stream:
            # The 200 waits for the engine's first answer: a refusal before it is a plain error status.
            return await opened(self._stream_completion(session_id, plan, url, stops, req, completion_id, created),
                                heartbeat_s=self.config.server.stream_heartbeat_interval_s)
        with self.in_flight.call(session_id) as running:
            result = await self.calls.final(plan)
            return await running.commit(self._record_completion(session_id, plan, url, result, stops, req,
                                                                completion_id, created))

    def _drop_if_unrecorded(self, session_id: str, running: Any) -> None:
        """A stream that failed before its recording began: a header session it alone created is not kept
        (as :meth:`open` does for a call that fails before its stream, and chat for its streams)."""
        if running.recording is None:
            self.book.drop_if_unused(session_id, own_calls=1)

    async def _stream_completion(self, session_id: str, plan: Any, url: str, stops: list[str], req: CompletionRequest,
                                 completion_id: str, created: int) -> AsyncIterator[bytes]:
        base = {"id": completion_id, "object": "text_completion", "created": created,
                "model": self.config.server.served_model_name}

        def chunk(text: str, finish: str | None = None, logprobs: Any = None) -> bytes:
            return sse({**base, "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}]})

        sent = ""
        result = None
        began = False  # a frame was sent: the 200 with it
        with self.in_flight.call(session_id) as running:
            try:
                async for event in self.calls.generate(plan):
                    if event is None:
                        began = True
                        yield KEEPALIVE
                    elif isinstance(event, str):
                        text = visible_prefix(event, stops).rstrip("\ufffd")
                        if len(text) > len(sent) and text.startswith(sent):
                            began = True
                            yield chunk(text[len(sent):])
                            sent = text
                    else:
                        result = event
                done = await running.commit(self._record_completion(session_id, plan, url, result, stops, req,
                                                                    completion_id, created))
            except DressageError as exc:
                self._drop_if_unrecorded(session_id, running)
                if not began:
                    raise  # nothing sent yet (see opened): the agent gets the error's own status
                self.book.failed(exc)
                yield sse(error_payload(exc))
                return
            except BaseException:  # the agent hung up mid-stream
                self._drop_if_unrecorded(session_id, running)
                raise
        choice = done["choices"][0]
        final = choice["text"]
        yield chunk(final[len(sent):] if final.startswith(sent) else "", choice["finish_reason"], choice["logprobs"])
        if req.stream_options and req.stream_options.get("include_usage"):
            yield sse({**base, "choices": [], "usage": done["usage"]})
        yield DONE
