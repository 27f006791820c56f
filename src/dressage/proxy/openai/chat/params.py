"""OpenAI chat-completions parameters -> the engine's sampling parameters, or a clear 400.

Every field of a chat call is in :data:`CHAT_PARAMS`: passed to the engine under SGLang's
``SamplingParams`` name or enforced by the Proxy itself (used), accepted and ignored because it
cannot change what is sampled, or refused with :class:`~dressage.errors.UnsupportedParameterError`
naming it. Nothing is dropped silently.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from dressage.errors import UnsupportedParameterError
from dressage.proxy.function_tools import chat_function_tools, check_arguments
from dressage.proxy.openai.policy import IGNORED, REFUSED, USED, Param, ParamPolicy, request_fields

__all__ = ["ChatOptions", "chat_options", "chat_messages", "CHAT_PARAMS", "SAMPLING_PARAMS"]

SAMPLING_PARAMS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty", "min_tokens": "min_new_tokens",
}
"""OpenAI (or vLLM-style extension) name -> SGLang ``SamplingParams`` name, passed as given."""


def _text_only(value: Any) -> str | None:
    return None if value == ["text"] else "only text output is supported: the served model writes text"


_IGNORED_PLATFORM = "accepted and ignored: OpenAI platform bookkeeping, it does not change what is sampled"

CHAT_PARAMS = ParamPolicy("chat completions", (
    Param("messages", USED, "roles `system`, `developer` (rendered as `system`), `user`, `assistant`, `tool`; "
          "content a string or `text` parts (other parts: 400, the served model reads text only); a tool call's "
          "`function.arguments` a JSON text (else 400 `invalid_value`)"),
    Param("model", USED, "accepted; the one served model answers (its name is reported back)"),
    Param("tools", USED, "function tools (`type` `function` or left out; `function.name` of letters, digits, `_`, "
          "`-`, `.`, unique; `parameters` a JSON Schema object), rendered by the chat template; tool-call blocks "
          "in the reply become `tool_calls`; `strict` accepted: under `required` or a named function the "
          "arguments follow the schema (a grammar), under `auto` they are what the model wrote (SGLang constrains "
          "a call only when one is forced); `custom` and hosted tool types: 400 naming the type, a malformed "
          "tool: 400 `invalid_value`"),
    Param("tool_choice", USED, '`none`: no tool rendered or parsed; `auto`; `required` / one named function: '
          'enforced by an engine grammar (SGLang `ebnf`) of the model\'s own call syntax, drawn once; a reply '
          'that is still no call is 502 `reply_constraint_unmet`'),
    Param("parallel_tool_calls", USED, "`false`: a reply with several calls is drawn again; `true` / unset: "
          "the model decides"),
    Param("temperature", USED, "engine `temperature`"),
    Param("top_p", USED, "engine `top_p`"),
    Param("top_k", USED, "engine `top_k` (an SGLang / vLLM extension)"),
    Param("min_p", USED, "engine `min_p` (an SGLang / vLLM extension)"),
    Param("frequency_penalty", USED, "engine `frequency_penalty`"),
    Param("presence_penalty", USED, "engine `presence_penalty`"),
    Param("repetition_penalty", USED, "engine `repetition_penalty` (an SGLang / vLLM extension)"),
    Param("logit_bias", USED, "engine `logit_bias` (token id -> bias in -100..100)"),
    Param("max_completion_tokens", USED, "engine `max_new_tokens`, capped by the Proxy's limits"),
    Param("max_tokens", USED, "engine `max_new_tokens`, capped by the Proxy's limits; left out: what the "
          "context window leaves (or `--default-max-tokens`)"),
    Param("min_tokens", USED, "engine `min_new_tokens` (an SGLang / vLLM extension)"),
    Param("stop", USED, "engine `stop` (up to 4); the reply text ends before the stop string"),
    Param("seed", USED, "engine `sampling_seed`"),
    Param("response_format", USED, "`text`; `json_object` / `json_schema`: engine `json_schema` (constrained "
          "decoding); with a forced tool call: 400"),
    Param("logprobs", USED, "the recorded logprobs of every generated token"),
    Param("top_logprobs", USED, "engine `top_logprobs_num` (0..20); needs `logprobs`"),
    Param("n", USED, "1..64 samples of the prompt, each its own engine call and recorded step"),
    Param("stream", USED, "OpenAI chunks"),
    Param("stream_options", USED, "`include_usage`: a last chunk with the usage"),
    Param("session_id", USED, "the rollout session (an `X-Session-Id` header wins)"),
    Param("instance_id", USED, "the prompt instance (an `X-Instance-Id` header wins)"),
    Param("turn_id", USED, "the agent turn (an `X-Turn-Id` header wins)"),
    Param("user", IGNORED, _IGNORED_PLATFORM),
    Param("metadata", IGNORED, _IGNORED_PLATFORM),
    Param("store", IGNORED, _IGNORED_PLATFORM),
    Param("service_tier", IGNORED, _IGNORED_PLATFORM),
    Param("prompt_cache_key", IGNORED, "accepted and ignored: the engine's prefix cache needs no key"),
    Param("prompt_cache_retention", IGNORED, "accepted and ignored: the engine's prefix cache needs no key"),
    Param("prompt_cache_options", IGNORED, "accepted and ignored: the engine's prefix cache needs no key"),
    Param("safety_identifier", IGNORED, _IGNORED_PLATFORM),
    Param("prediction", IGNORED, "accepted and ignored: a predicted output only speeds a reply up, it does "
          "not change it"),
    Param("reasoning_effort", IGNORED, "accepted and ignored: the served model reasons as its chat template "
          "says"),
    Param("verbosity", IGNORED, "accepted and ignored: the served model's length is its own"),
    Param("modalities", IGNORED, '`["text"]` accepted; any other value: 400 (text output only)', _text_only),
    Param("audio", REFUSED, "audio output is not supported: the served model writes text only"),
    Param("functions", REFUSED, "the deprecated functions API is not supported; send tools"),
    Param("function_call", REFUSED, "the deprecated functions API is not supported; send tool_choice"),
    Param("web_search_options", REFUSED, "web search is a hosted tool this Proxy does not run"),
    Param("moderation", REFUSED, "moderation is not run by this Proxy"),
))
"""What a chat-completions call does with each field (``docs/parameters.md`` renders it)."""

_TEXT_PARTS = frozenset({"text"})


@dataclass(frozen=True, slots=True)
class ChatOptions:
    """What a chat call asks beyond its messages, checked and translated."""

    sampling: dict[str, Any]
    """SGLang sampling parameters (without ``max_new_tokens`` / ``stop_token_ids``)."""
    stops: tuple[str, ...] = ()
    n: int = 1
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    tool_mode: str = "auto"
    """``none`` / ``auto`` / ``required`` / ``function`` (one named function)."""
    tool_name: str | None = None
    single_call: bool = False
    """``parallel_tool_calls: false``: a reply may call at most one tool."""

    @property
    def constrained(self) -> bool:
        """Replies are checked after sampling (and sampled again when they break the rule)."""
        return self.tool_mode in ("required", "function") or self.single_call

    @property
    def buffered(self) -> bool:
        """A stream is sent only once complete: several samples, or replies checked before they are shown."""
        return self.n > 1 or self.constrained

    def violation(self, message: dict[str, Any]) -> str | None:
        """Why ``message`` (a parsed reply) breaks the call's tool rules, ``None`` when it does not."""
        calls = message.get("tool_calls") or []
        if self.tool_mode == "required" and not calls:
            return 'tool_choice "required": the reply called no tool'
        if self.tool_mode == "function":
            if not calls:
                return f"tool_choice names {self.tool_name!r}: the reply called no tool"
            other = sorted({c["function"]["name"] for c in calls} - {self.tool_name})
            if other:
                return f"tool_choice names {self.tool_name!r}: the reply called {', '.join(other)}"
        if self.single_call and len(calls) > 1:
            return f"parallel_tool_calls is false: the reply made {len(calls)} calls"
        return None

    def sample_seed(self, index: int, attempt: int) -> int | None:
        """``sampling_seed`` of sample ``index``'s ``attempt``-th draw.

        One draw of one sample keeps the request's ``seed`` (``None``: the engine's own
        randomness). Several samples (``n``) or a new draw after a refused reply must differ:
        they get ``seed + attempt * n + index``, or fresh random seeds when no seed was given.
        """
        if self.n == 1 and attempt == 0:
            return self.seed
        if self.seed is None:
            return secrets.randbits(31)
        return self.seed + attempt * self.n + index


def _tool_mode(req: Any) -> tuple[str, str | None]:
    choice = req.tool_choice
    if isinstance(choice, dict):
        kind, fn = choice.get("type", "function"), choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if kind != "function" or not isinstance(name, str):
            raise UnsupportedParameterError(
                "tool_choice", f'a {kind!r} tool choice is not served: "none", "auto", "required" or '
                               '{"type": "function", "function": {"name": ...}}')
        if not any((t.get("function") or {}).get("name") == name for t in req.tools or ()):
            raise UnsupportedParameterError("tool_choice", f"names function {name!r}, which is not in tools")
        return "function", name
    if choice == "required" and not req.tools:
        raise UnsupportedParameterError("tool_choice", '"required" needs tools')
    return (choice or "auto"), None


def _response_format(fmt: dict[str, Any] | None) -> str | None:
    """The ``json_schema`` sampling parameter (a JSON string) for ``response_format``."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise UnsupportedParameterError("response_format.json_schema.schema", "must be a JSON Schema object")
        return json.dumps(schema, sort_keys=True)
    raise UnsupportedParameterError("response_format.type",
                                    f'must be "text", "json_object" or "json_schema", got {kind!r}')


def _logit_bias(bias: dict[str, float]) -> dict[str, float]:
    for key, value in bias.items():
        if not key.lstrip("-").isdigit() or int(key) < 0:
            raise UnsupportedParameterError("logit_bias", f"keys are token ids, got {key!r}")
        if not -100.0 <= value <= 100.0:
            raise UnsupportedParameterError("logit_bias", f"values are in [-100, 100], got {value} for {key}")
    return {str(int(k)): float(v) for k, v in bias.items()}


def chat_options(req: Any) -> ChatOptions:
    """Check a :class:`~dressage.proxy.schemas.ChatRequest`'s parameters and translate them."""
    CHAT_PARAMS.check(request_fields(req))
    chat_function_tools(req.tools)
    sampling: dict[str, Any] = {}
    for name, sglang in SAMPLING_PARAMS.items():
        value = getattr(req, name)
        if value is not None:
            sampling[sglang] = value
    if req.logit_bias:
        sampling["logit_bias"] = _logit_bias(req.logit_bias)
    schema = _response_format(req.response_format)
    mode, name = _tool_mode(req)
    if schema is not None:
        if mode in ("required", "function"):
            raise UnsupportedParameterError("response_format", "a JSON reply cannot also be a forced tool call")
        sampling["json_schema"] = schema
    if req.top_logprobs and not req.logprobs:
        raise UnsupportedParameterError("top_logprobs", "needs logprobs: true")
    stops = () if req.stop is None else ((req.stop,) if isinstance(req.stop, str) else tuple(req.stop))
    if stops:
        sampling["stop"] = list(stops)
    return ChatOptions(sampling, stops, req.n, req.seed, bool(req.logprobs), int(req.top_logprobs or 0), mode,
                       name, req.parallel_tool_calls is False)


def chat_messages(req: Any) -> list[dict[str, Any]]:
    """The request's messages as the chat template takes them.

    ``developer`` turns are system turns (as OpenAI-compatible servers render them); content
    parts other than text (images, audio, files) are refused: the served model reads text only. A tool
    call's ``arguments`` must be a JSON text of Unicode text
    (:func:`~dressage.proxy.function_tools.check_arguments`).
    """
    out = []
    for i, m in enumerate(req.messages):
        msg = m.model_dump(exclude_none=True)
        if msg["role"] == "function":
            raise UnsupportedParameterError(f"messages[{i}].role", '"function" messages (the deprecated function '
                                            'calls) are not served: send tool_calls and "tool" messages')
        if "function_call" in msg:
            raise UnsupportedParameterError(f"messages[{i}].function_call", "the deprecated function call is not "
                                            "served (it would be left out of the prompt): send tool_calls")
        refusal = msg.pop("refusal", None)
        if refusal:  # what the assistant answered when it refused: its turn's text
            if msg.get("content"):
                raise UnsupportedParameterError(f"messages[{i}].refusal", "a turn with both content and a "
                                                "refusal cannot be rendered as one assistant turn")
            msg["content"] = refusal
        if msg["role"] == "developer":
            msg["role"] = "system"
        content = msg.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
                    raise UnsupportedParameterError(
                        f"messages[{i}].content[{j}]",
                        f"{kind or 'untyped'} content parts are not supported: the served model reads text only")
        for j, call in enumerate(msg.get("tool_calls") or ()):
            if isinstance(call, dict) and call.get("type", "function") != "function":
                raise UnsupportedParameterError(f"messages[{i}].tool_calls[{j}].type",
                                                f"{call.get('type')!r} tool calls are not served: function calls only")
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                check_arguments(fn.get("arguments"), f"messages[{i}].tool_calls[{j}].function.arguments")
        out.append(msg)
    return out
