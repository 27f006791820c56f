"""The Anthropic Messages API as chat calls: request -> chat messages and tools, chat completion -> Message.

A Messages request becomes the chat message list a chat client would send for the same
conversation (``system`` and ``role: "system"`` messages as the system turn, ``tool_use`` blocks as
the assistant's ``tool_calls``, ``tool_result`` blocks as tool turns, ``thinking`` blocks as the
assistant's ``reasoning_content``), so the call takes the chat path whole: same prompt (TITO), same
StepRecord, same Segments. The reply comes back as content blocks (``thinking``, ``text``,
``tool_use``). Errors are answered in Anthropic's shape (:func:`error_object`).
"""

from __future__ import annotations

import json
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dressage.errors import DressageError, UnsupportedParameterError
from dressage.proxy.engine_params import CHAT_FIELDS
from dressage.proxy.function_tools import check_function, check_unique_names
from dressage.proxy.openai.streaming import agent_message
from dressage.proxy.schemas import Flag, Integer, Number

__all__ = ["MessagesRequest", "CountTokensRequest", "NO_OP_PARAMS", "THINKING_SIGNATURE", "chat_messages",
           "chat_tools", "chat_tool_choice", "chat_body", "message_object", "stop_reason", "message_ids",
           "error_object", "error_type", "invalid_body", "is_anthropic_path", "dressage_error_object",
           "dressage_error_message",
           "content_blocks", "usage_object", "count_body", "CHAT_NAMES"]

NO_OP_PARAMS = frozenset({"thinking", "context_management", "output_config", "output_format", "metadata",
                          "service_tier", "mcp_servers", "betas", "cache_control", "inference_geo", "speed",
                          "diagnostics", "user_profile_id", "workspace_id", "fallbacks", "billing_policy",
                          "fallback_credit_token"})
"""Accepted and ignored: Anthropic platform bookkeeping and settings the served model cannot take per call
(the reasoning budget, effort, prompt caching, where and how fast Anthropic serves the call, its accounts and
billing, fallback models); none changes a reply's tokens here. ``mcp_servers`` must be empty,
``context_management`` may hold no edit that drops context, and ``output_config.format`` (or the older
``output_format``) is served, as a chat ``response_format``."""

REFUSED_PARAMS = {"container": "code-execution containers are not run by this Proxy",
                  "compaction": "server-side compaction is not run by this Proxy"}
"""Messages parameters that would change the reply and that the Proxy does not serve: 400 naming them."""

THINKING_SIGNATURE = "dressage"
"""The ``signature`` of every thinking block the Proxy answers: clients send it back unchanged, and the
Proxy reads thinking it produced from the text, so one stable value is enough."""

_SERVED_TOOL_TYPES = (None, "custom")


class MessagesRequest(BaseModel):
    """``POST /v1/messages`` body; a key not declared here is refused unless it is in :data:`NO_OP_PARAMS`."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: Integer = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: Optional[Union[str, list[dict[str, Any]]]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    stop_sequences: Optional[list[str]] = None
    temperature: Optional[Number] = Field(default=None, ge=0.0, le=1.0)
    top_p: Optional[Number] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[Integer] = Field(default=None, ge=1)
    stream: Optional[Flag] = None


class CountTokensRequest(BaseModel):
    """``POST /v1/messages/count_tokens`` body: a Messages request without ``max_tokens`` or sampling."""

    model_config = ConfigDict(extra="allow")

    model: Optional[str] = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: Optional[Union[str, list[dict[str, Any]]]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None


# --------------------------------------------------------------------- request -> chat
def _kind(block: Any) -> str | None:
    return block.get("type") if isinstance(block, dict) else None


def _texts(content: Any, where: str, *, allowed: str) -> str:
    """The text of a string or a list of ``text`` blocks (several are joined by a blank line)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise UnsupportedParameterError(where, "must be a string or a list of content blocks")
    out = []
    for j, block in enumerate(content):
        kind = _kind(block)
        if kind != "text" or not isinstance(block.get("text"), str):
            raise _refused_block(f"{where}[{j}]", kind, allowed)
        out.append(block["text"])
    return "\n\n".join(out)


def _refused_block(where: str, kind: str | None, allowed: str) -> UnsupportedParameterError:
    if kind in ("image", "document", "search_result", "container_upload"):
        why = f"{kind} blocks are not served: the served model reads text only"
    else:
        why = f"content block type {kind!r} is not supported here ({allowed})"
    return UnsupportedParameterError(f"{where}.type", why)


def _system_text(system: Any) -> str:
    if system is None:
        return ""
    return _texts(system, "system", allowed="text blocks")


def _tool_result_text(content: Any, where: str) -> str:
    """A ``tool_result``'s content as the tool turn's text.

    A ``tool_reference`` block (what a tool search answers: a deferred tool made available) reads as
    that tool's name: every tool of the request, deferred ones included, is in the rendered prompt
    from the first turn, so the reference adds no definition the model lacks.
    """
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise UnsupportedParameterError(where, "must be a string or a list of content blocks")
    out = []
    for j, block in enumerate(content):
        kind = _kind(block)
        if kind == "text" and isinstance(block.get("text"), str):
            out.append(block["text"])
        elif kind == "tool_reference" and isinstance(block.get("tool_name"), str):
            out.append(block["tool_name"])
        else:
            raise _refused_block(f"{where}[{j}]", kind, "text, tool_reference")
    return "\n\n".join(out)


def _user_turns(content: Any, at: str) -> list[dict[str, Any]]:
    """Chat messages of one user message: ``tool_result`` blocks as tool turns, text as user turns, in order."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise UnsupportedParameterError(f"{at}.content", "must be a string or a list of content blocks")
    out: list[dict[str, Any]] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": "\n\n".join(texts)})
            texts.clear()

    for j, block in enumerate(content):
        where, kind = f"{at}.content[{j}]", _kind(block)
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise UnsupportedParameterError(f"{where}.tool_use_id", "a tool_result block needs a tool_use_id")
            flush()
            text = _tool_result_text(block.get("content"), f"{where}.content")
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        else:
            raise _refused_block(where, kind, "text, tool_result")
    flush()
    return out


def _assistant_turn(content: Any, at: str) -> dict[str, Any]:
    """The chat assistant message of one assistant message (text, thinking, tool_use blocks)."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise UnsupportedParameterError(f"{at}.content", "must be a string or a list of content blocks")
    texts, reasoning, calls = [], [], []
    for j, block in enumerate(content):
        where, kind = f"{at}.content[{j}]", _kind(block)
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
        elif kind == "redacted_thinking" and isinstance(block.get("data"), str):
            reasoning.append(block["data"])
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise UnsupportedParameterError(where, "a tool_use block needs an id and a name")
            args = block.get("input", {})
            if not isinstance(args, dict):
                raise UnsupportedParameterError(f"{where}.input", "must be an object")
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": json.dumps(args, ensure_ascii=False)}})
        else:
            raise _refused_block(where, kind, "text, thinking, redacted_thinking, tool_use")
    msg: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts) if texts or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    if reasoning:
        msg["reasoning_content"] = "\n\n".join(reasoning)
    return msg


def chat_messages(system: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of a Messages conversation.

    ``system`` and the text of every ``role: "system"`` message (in their order) make one system
    turn at the start; the other messages follow as chat turns.
    """
    head = [_system_text(system)] if system is not None else []
    turns: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise UnsupportedParameterError(at, "must be an object with a role and content")
        role, content = msg.get("role"), msg.get("content")
        if role == "system":
            head.append(_texts(content, f"{at}.content", allowed="text blocks"))
        elif role == "user":
            turns += _user_turns(content, at)
        elif role == "assistant":
            turns.append(_assistant_turn(content, at))
        else:
            raise UnsupportedParameterError(f"{at}.role", f"role {role!r} is not one of user, assistant, system")
    text = "\n\n".join(t for t in head if t)
    return ([{"role": "system", "content": text}] if text else []) + turns


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Chat ``tools`` of Messages client tools; a server tool (``web_search_...``, ``bash_...``) is refused."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise UnsupportedParameterError(f"tools[{i}]", "must be an object")
        kind = tool.get("type")
        if kind not in _SERVED_TOOL_TYPES:
            raise UnsupportedParameterError(
                f"tools[{i}].type", f"tool type {kind!r} is a server tool, which this Proxy does not run; "
                f"only client tools (name, description, input_schema) are supported")
        check_function(tool, f"tools[{i}]", schema="input_schema", what="tool", schema_required=True)
        fn: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        fn["parameters"] = tool["input_schema"]
        out.append({"type": "function", "function": fn})  # defer_loading too: the template renders every tool
    check_unique_names((t["function"]["name"], f"tools[{i}].name") for i, t in enumerate(out))
    return out


def chat_tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool | None]:
    """The chat ``tool_choice`` and ``parallel_tool_calls`` of a Messages ``tool_choice``."""
    if choice is None:
        return None, None
    kind = choice.get("type")
    single = False if choice.get("disable_parallel_tool_use") else None
    if kind == "auto":
        return "auto", single
    if kind == "any":
        return "required", single
    if kind == "none":
        return "none", None
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise UnsupportedParameterError("tool_choice.name", 'a tool_choice of type "tool" needs a name')
        return {"type": "function", "function": {"name": choice["name"]}}, single
    raise UnsupportedParameterError("tool_choice.type", f"{kind!r} is not one of auto, any, tool, none")


def _check_no_ops(req: BaseModel) -> None:
    for key, value in (req.model_extra or {}).items():
        if value is None:
            continue
        if key in REFUSED_PARAMS:
            raise UnsupportedParameterError(key, REFUSED_PARAMS[key])
        if key not in NO_OP_PARAMS:
            raise UnsupportedParameterError(key, "not a Messages parameter this Proxy serves")
        if key == "mcp_servers" and value:
            raise UnsupportedParameterError("mcp_servers", "MCP servers are not run by this Proxy")
        if key == "context_management":
            _check_context_edits(value)


def _check_context_edits(value: Any) -> None:
    """Context editing that keeps the conversation as sent (no edits, or ``clear_thinking`` keeping every turn)
    changes nothing; an edit that would drop context (``clear_tool_uses``, thinking of earlier turns) would
    make Anthropic's reply differ from the one the Proxy samples over the whole conversation: 400."""
    edits = value.get("edits") if isinstance(value, dict) else None
    for i, edit in enumerate(edits or ()):
        kind = edit.get("type") if isinstance(edit, dict) else None
        keep = edit.get("keep") if isinstance(edit, dict) else None
        if isinstance(kind, str) and kind.startswith("clear_thinking") and keep in ("all", {"type": "all"}):
            continue
        raise UnsupportedParameterError(f"context_management.edits[{i}]",
                                        f"{kind!r} would drop context; the Proxy never edits the conversation")


def _response_format(req: BaseModel) -> dict[str, Any] | None:
    """The chat ``response_format`` of ``output_config.format``, or of the older ``output_format`` (structured
    output; the chat path serves it)."""
    extra = req.model_extra or {}
    config = extra.get("output_config")
    fmt, where = (config.get("format") if isinstance(config, dict) else None), "output_config.format"
    if extra.get("output_format") is not None:
        if fmt is not None:
            raise UnsupportedParameterError("output_format", "give output_config.format or output_format, not both")
        fmt, where = extra["output_format"], "output_format"
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise UnsupportedParameterError(where, 'only {"type": "json_schema", "schema": {...}} is supported')
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def _refuse_prefill(messages: list[dict[str, Any]], turns: list[dict[str, Any]]) -> None:
    """On Messages a last assistant turn with text is a prefill the reply continues; the chat path would
    close it as a finished turn and sample a new one, another reply than the one asked for: 400."""
    last = turns[-1] if turns else None
    if last is not None and last["role"] == "assistant" and (last.get("content") or "").strip() \
            and not last.get("tool_calls"):
        raise UnsupportedParameterError(f"messages[{len(messages) - 1}]",
                                        "a last assistant message (a prefill to continue) is not served by this "
                                        "Proxy: end the conversation with a user message")


def chat_body(req: MessagesRequest) -> dict[str, Any]:
    """The chat request body equivalent to ``req`` (validated by the chat schema afterwards)."""
    _check_no_ops(req)
    choice, parallel = chat_tool_choice(req.tool_choice)
    turns = chat_messages(req.system, req.messages)
    _refuse_prefill(req.messages, turns)
    body: dict[str, Any] = {"model": req.model, "messages": turns,
                            "tools": chat_tools(req.tools), "tool_choice": choice, "parallel_tool_calls": parallel,
                            "max_tokens": req.max_tokens, "temperature": req.temperature, "top_p": req.top_p,
                            "top_k": req.top_k, "stop": req.stop_sequences or None, "stream": bool(req.stream),
                            "response_format": _response_format(req)}
    return {k: v for k, v in body.items() if v is not None}


def count_body(req: CountTokensRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, Any]:
    """The chat messages, tools and tool choice whose rendered prompt ``count_tokens`` measures."""
    _check_no_ops(req)
    choice, _ = chat_tool_choice(req.tool_choice)
    return chat_messages(req.system, req.messages), chat_tools(req.tools), choice


# --------------------------------------------------------------------- chat -> Message
def message_ids(completion_id: str) -> tuple[str, str]:
    """Message id and tool_use id stem of one chat completion id."""
    stem = completion_id.split("-", 1)[-1]
    return f"msg_{stem}", f"toolu_{stem}"


def stop_reason(finish_reason: str, matched: str | None) -> str:
    """Anthropic's ``stop_reason`` of a chat ``finish_reason`` (``matched``: the stop sequence hit)."""
    if finish_reason == "tool_calls":
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if matched is not None else "end_turn"


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def content_blocks(message: dict[str, Any], completion_id: str) -> list[dict[str, Any]]:
    """The content blocks of a recorded assistant message (thinking, text, tool_use)."""
    _, tool_stem = message_ids(completion_id)
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content") is not None:
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": THINKING_SIGNATURE})
    calls = message.get("tool_calls") or []
    text = message.get("content") or ""
    if text or not calls:
        blocks.append({"type": "text", "text": text})
    for i, call in enumerate(calls):
        blocks.append({"type": "tool_use", "id": f"{tool_stem}_{i}", "name": call["function"]["name"],
                       "input": _input(call["function"]["arguments"])})
    return blocks


def usage_object(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": int(input_tokens), "output_tokens": int(output_tokens),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def message_object(completion: dict[str, Any], *, model: str, matched: str | None) -> dict[str, Any]:
    """The Message of a recorded chat completion (its first choice)."""
    choice = completion["choices"][0]
    usage = completion["usage"]
    return {"id": message_ids(completion["id"])[0], "type": "message", "role": "assistant", "model": model,
            "content": content_blocks(choice["message"], completion["id"]),
            "stop_reason": stop_reason(choice["finish_reason"], matched), "stop_sequence": matched,
            "usage": usage_object(usage["prompt_tokens"], usage["completion_tokens"])}


# --------------------------------------------------------------------- errors
def is_anthropic_path(path: str) -> bool:
    """Whether ``path`` is a Messages endpoint (its errors take Anthropic's shape)."""
    return path.endswith("/v1/messages") or path.endswith("/v1/messages/count_tokens")


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large", 422: "invalid_request_error",
          429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def error_type(status: int) -> str:
    """Anthropic's error ``type`` of an HTTP status (``api_error`` for any other failure)."""
    return _TYPES.get(int(status), "api_error")


def error_object(status: int, message: str) -> dict[str, Any]:
    """An Anthropic error body."""
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def dressage_error_message(exc: DressageError) -> str:
    """What an Anthropic error says of a Dressage error: its agent message (no engine URL or other
    internal detail), led by the parameter it names."""
    param = getattr(exc, "param", None)
    text = agent_message(exc)
    return text if not param or param in text else f"{param}: {text}"


def dressage_error_object(exc: DressageError) -> dict[str, Any]:
    """The Anthropic error body of a Dressage error (its class's status; the parameter it names first)."""
    return error_object(exc.http_status, dressage_error_message(exc))


CHAT_NAMES = {chat: names["anthropic"] for chat, names in CHAT_FIELDS.items()
              if "anthropic" in names and "." not in chat}
"""The Messages name of a chat parameter, for errors the chat schema raises on a translated request (the
top-level fields of the one table, :data:`~dressage.proxy.engine_params.CHAT_FIELDS`, that also names the
Proxy's own refusals of them)."""


def invalid_body(exc: ValidationError, names: dict[str, str] | None = None) -> UnsupportedParameterError:
    """A 400 naming the first field a request body breaks (``max_tokens: Field required``); ``names``
    renames a top-level field (the chat schema's name -> the client's)."""
    errors = [dict(e, loc=(names.get(str(e["loc"][0]), e["loc"][0]), *e["loc"][1:]) if names and e.get("loc") else
                   e.get("loc", ())) for e in exc.errors()]
    where = ".".join(str(p) for p in errors[0].get("loc", ())) if errors else "body"
    where = where or "body"

    def said(e: dict[str, Any]) -> str:
        loc = ".".join(str(p) for p in e.get("loc", ())) or "body"
        return str(e.get("msg")) if loc == where else f"{loc}: {e.get('msg')}"

    return UnsupportedParameterError(where, "; ".join(said(e) for e in errors[:5]))
