"""The client's name of an SGLang sampling parameter, for an engine's refusal of a request.

An engine that refuses a request names its own parameter (``sampling_params.logit_bias: ...``, or
SGLang's ``temperature must be non-negative, ...``); the agent sent another name on another API
(``logit_bias`` on chat, ``max_output_tokens`` on Responses, ``stop_sequences`` on Anthropic
Messages). :data:`CLIENT_NAMES` is the one table from one to the other; :func:`name_client_param`
puts the client's name into the refusal's ``param``. A parameter with no clear counterpart on an API
(one the Proxy sets itself there) leaves ``param`` unset.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from dressage.errors import EngineRequestError, UnsupportedParameterError

__all__ = ["CLIENT_NAMES", "CHAT_FIELDS", "APIS", "engine_param_of", "name_client_param"]

APIS = ("chat", "completions", "responses", "anthropic")
"""The order of each :data:`CLIENT_NAMES` row; ``generate`` (the token-level call) takes SGLang's names."""

CLIENT_NAMES: dict[str, tuple[str | tuple[str, ...] | None, ...]] = {
    # SGLang sampling parameter: its name on chat, completions, Responses, Anthropic Messages. A tuple
    # lists the fields that set it, the one the request carries first (else the first) is named.
    "temperature": ("temperature", "temperature", "temperature", "temperature"),
    "top_p": ("top_p", "top_p", "top_p", "top_p"),
    "top_k": ("top_k", None, None, "top_k"),
    "min_p": ("min_p", None, None, None),
    "frequency_penalty": ("frequency_penalty", "frequency_penalty", None, None),
    "presence_penalty": ("presence_penalty", "presence_penalty", None, None),
    "repetition_penalty": ("repetition_penalty", None, None, None),
    "min_new_tokens": ("min_tokens", None, None, None),
    "max_new_tokens": (("max_tokens", "max_completion_tokens"), "max_tokens", "max_output_tokens", "max_tokens"),
    "stop": ("stop", "stop", None, "stop_sequences"),
    "sampling_seed": ("seed", "seed", None, None),
    "logit_bias": ("logit_bias", "logit_bias", None, None),
    "json_schema": ("response_format", None, "text.format", "output_config.format"),
    "ebnf": ("tool_choice", None, "tool_choice", "tool_choice"),
    "top_logprobs_num": ("top_logprobs", "logprobs", ("top_logprobs", "include"), None),
}

CHAT_FIELDS: dict[str, dict[str, str]] = {
    # A chat field the Proxy's own check refuses (``chat.params.chat_options``) on a Responses or Messages
    # request it translated to chat: that field's name on those APIs.
    "response_format": {"responses": "text.format", "anthropic": "output_config.format"},
    "response_format.type": {"responses": "text.format.type", "anthropic": "output_config.format.type"},
    "response_format.json_schema.schema": {"responses": "text.format.schema",
                                           "anthropic": "output_config.format.schema"},
    "stop": {"anthropic": "stop_sequences"},
    "parallel_tool_calls": {"anthropic": "tool_choice.disable_parallel_tool_use"},
}

_PREFIXED = re.compile(r"\bsampling_params\.([A-Za-z_]+)")
_LEADING = re.compile(r"^\s*([A-Za-z_]+)\b")


def engine_param_of(message: str) -> str | None:
    """The SGLang sampling parameter an engine's refusal names: ``sampling_params.NAME`` anywhere, or a
    known parameter the message opens with (SGLang's own checks: ``top_p must be in (0, 1], ...``), or
    ``max_new_tokens`` for SGLang's refusal of a prompt that fits whose reply budget does not ("... N tokens
    for the completion", said only once the input alone fits the context)."""
    found = _PREFIXED.search(message)
    if found:
        return found.group(1)
    if "tokens for the completion" in message:
        return "max_new_tokens"
    lead = _LEADING.match(message)
    return lead.group(1) if lead and lead.group(1) in CLIENT_NAMES else None


def name_client_param(exc: BaseException, api: str, sent: Iterable[str] = ()) -> None:
    """Give an engine refusal (:class:`EngineRequestError`) the ``param`` the client of ``api`` knows.

    ``sent``: the fields the request set (to pick among several that set one parameter). ``generate``
    names ``sampling_params.NAME`` as sent. Anything but an engine refusal, or one that already names a
    parameter, is left as it is, but for the Proxy's own refusal of a chat field (:data:`CHAT_FIELDS`) on a
    request it translated from ``api``, which gets that API's name of the field."""
    if isinstance(exc, UnsupportedParameterError):
        renamed = CHAT_FIELDS.get(exc.param, {}).get(api)
        if renamed is not None:
            exc.rename(renamed)
        return
    if not isinstance(exc, EngineRequestError) or getattr(exc, "param", None) is not None:
        return
    name = engine_param_of(exc.engine_message or str(exc))
    if name is None:
        return
    if api == "generate":
        exc.param = f"sampling_params.{name}"
        return
    row = CLIENT_NAMES.get(name)
    field: Any = row[APIS.index(api)] if row is not None else None
    if isinstance(field, tuple):
        given = set(sent)
        field = next((f for f in field if f.split(".")[0] in given), field[0])
    if field is not None:
        exc.param = field
