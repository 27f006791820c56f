"""The OpenAI Responses API as chat calls: request -> chat messages, chat completion -> Response.

A Responses request becomes the chat message list a chat client would send for the same
conversation (``instructions`` as the system turn, input items as messages, ``function_call``
items as the assistant's ``tool_calls``, ``function_call_output`` items as tool turns), so the
call takes the chat path whole: same prompt (TITO), same StepRecord, same Segments. The reply
comes back as Response output items (``reasoning``, ``message``, ``function_call``).

What the endpoint does with each request field is :data:`RESPONSES_PARAMS`. A ``namespace`` tool (a
group of function tools) is rendered as its functions under qualified names ``NS.name``; a call of
one answers a ``function_call`` item with ``namespace`` NS and the function's own ``name``, as
OpenAI's Responses types carry it, and such an item sent back renders the qualified name again.

``previous_response_id`` rebuilds the conversation from :class:`ResponseMemory`: the input and
output of that response (without its instructions, which OpenAI does not carry over), then the
new input.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Annotated, Any, Callable, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from dressage.errors import UnknownResponseError, UnsupportedParameterError
from dressage.proxy.function_tools import (check_arguments, check_function, check_name, check_unique_names,
                                           refuse_tool_type)
from dressage.proxy.openai.policy import IGNORED, REFUSED, USED, Param, ParamPolicy, request_fields
from dressage.proxy.schemas import Flag, Integer, Number, Shallow, Storable

__all__ = ["RESPONSES_PARAMS", "ResponsesRequest", "ResponseMemory", "conversation", "chat_body", "response_object",
           "input_messages", "chat_tools", "chat_tool_choice", "item_ids", "qualified_name", "tool_namespaces"]

_TEXT_PARTS = ("input_text", "output_text", "text")


LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _keys_within(allowed: frozenset[str], served: str) -> Callable[[Any], str | None]:
    def refuse(value: Any) -> str | None:
        if not isinstance(value, dict):
            return "must be an object"
        other = sorted(set(value) - allowed)
        return None if not other else f"{', '.join(other)} not supported ({served})"
    return refuse


def _reasoning(value: Any) -> str | None:
    """``effort``, ``summary``, ``mode`` (effort-like) and ``context: "auto"`` change nothing here; another
    ``context`` would choose which earlier reasoning the prompt carries, which the chat template decides."""
    other = _keys_within(frozenset({"effort", "summary", "generate_summary", "mode", "context"}),
                         "reasoning takes effort, summary, mode and context")(value)
    if other is not None:
        return other
    context = value.get("context")
    if context not in (None, "auto"):
        return (f"context {context!r} is not supported: which earlier reasoning the prompt carries is the chat "
                "template's choice (\"auto\")")
    return None


def _truncation(value: Any) -> str | None:
    return None if value == "disabled" else f"{value!r} is not supported (the conversation is never truncated)"


def _background(value: Any) -> str | None:
    return "background responses are not supported" if value else None


_IGNORED_PLATFORM = "accepted and ignored: OpenAI platform bookkeeping, it does not change what is sampled"
_CACHE = "accepted and ignored: the engine's prefix cache needs no key"

RESPONSES_PARAMS = ParamPolicy("Responses", (
    Param("input", USED, "a string (one user message) or items: `message` (user, system, developer, assistant; "
          "text parts), `function_call` (`arguments` a JSON text), `function_call_output`, `reasoning`; other "
          "items: 400"),
    Param("instructions", USED, "the system turn (not carried over by `previous_response_id`)"),
    Param("model", USED, "accepted; the one served model answers (its name is reported back)"),
    Param("tools", USED, "`function` tools (names and `parameters` as chat completions), and `namespace` groups of "
          "function tools (rendered as `NS.name`, answered with `namespace`); hosted tools (`web_search`, "
          "`file_search`, `mcp`, ...) and `custom` tools: 400 naming the type"),
    Param("tool_choice", USED, "`none`, `auto`, `required`, one named function: as chat completions"),
    Param("parallel_tool_calls", USED, "as chat completions"),
    Param("temperature", USED, "engine `temperature`"),
    Param("top_p", USED, "engine `top_p`"),
    Param("max_output_tokens", USED, "engine `max_new_tokens`, capped by the Proxy's limits"),
    Param("top_logprobs", USED, "`logprobs` of the reply's `output_text` with that many alternatives"),
    Param("text", USED, "`format` as chat `response_format`; `verbosity` accepted and ignored (the served "
          "model's length is its own)", _keys_within(frozenset({"format", "verbosity"}), "text takes format "
                                                     "and verbosity")),
    Param("include", USED, f"`{LOGPROBS_INCLUDE}`: the reply's logprobs; other values (`reasoning.encrypted_"
          "content`, ...) only add output detail: accepted, nothing added"),
    Param("previous_response_id", USED, "continues a stored response of the session"),
    Param("store", USED, "`false`: the response is not kept for `previous_response_id`"),
    Param("stream", USED, "Responses server-sent events"),
    Param("metadata", IGNORED, "echoed in the Response; not shown to the model"),
    Param("reasoning", IGNORED, "`effort`, `summary`, `mode` and `context: \"auto\"` accepted and ignored: the "
          "served model reasons as its chat template says, its reasoning comes back whole as `reasoning` items; "
          "another `context`: 400", _reasoning),
    Param("truncation", IGNORED, '`"disabled"` accepted; `"auto"`: 400 (the conversation is never truncated)',
          _truncation),
    Param("background", IGNORED, "`false` accepted; `true`: 400 (background responses are not supported)",
          _background),
    Param("background_options", IGNORED, "accepted and ignored: background responses are never made"),
    Param("stream_options", IGNORED, "accepted and ignored: delivery options"),
    Param("client_metadata", IGNORED, "accepted and ignored: client bookkeeping (Codex sends it)"),
    Param("user", IGNORED, _IGNORED_PLATFORM),
    Param("service_tier", IGNORED, _IGNORED_PLATFORM),
    Param("safety_identifier", IGNORED, _IGNORED_PLATFORM),
    Param("prompt_cache_key", IGNORED, _CACHE),
    Param("prompt_cache_retention", IGNORED, _CACHE),
    Param("prompt_cache_options", IGNORED, _CACHE),
    Param("image", IGNORED, "accepted and ignored: image options; the served model reads and writes text only"),
    Param("conversation", REFUSED, "stored conversations are not supported; send the items or "
          "previous_response_id"),
    Param("prompt", REFUSED, "stored prompt templates are not supported"),
    Param("max_tool_calls", IGNORED, "accepted and ignored: it caps calls of built-in tools, and this Proxy "
          "serves none"),
    Param("context_management", REFUSED, "server-side compaction is not run by this Proxy"),
    Param("moderation", REFUSED, "moderation is not run by this Proxy"),
    Param("access_programs", REFUSED, "access programs are not available on this Proxy"),
))
"""What a Responses call does with each field (``docs/parameters.md`` renders it)."""


class ResponsesRequest(BaseModel):
    """``POST /v1/responses`` body; every field, declared here or not, is checked by :data:`RESPONSES_PARAMS`."""

    model_config = ConfigDict(extra="allow")

    model: Optional[str] = None
    # A null input is an absent one (as every null field is), not a value of the wrong type.
    input: Annotated[Union[str, list[dict[str, Any]]], Shallow, BeforeValidator(lambda v: "" if v is None else v)] = ""
    instructions: Annotated[Optional[Union[str, list[dict[str, Any]]]], Shallow] = None
    tools: Annotated[Optional[list[dict[str, Any]]], Shallow] = None
    tool_choice: Annotated[Any, Shallow] = None
    parallel_tool_calls: Optional[Flag] = None
    temperature: Optional[Number] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[Number] = Field(default=None, gt=0.0, le=1.0)
    max_output_tokens: Optional[Integer] = Field(default=None, ge=1)
    store: Optional[Flag] = None
    previous_response_id: Optional[str] = None
    stream: Flag = False
    metadata: Annotated[Optional[dict[str, Any]], Storable] = None
    text: Annotated[Optional[dict[str, Any]], Shallow] = None
    reasoning: Annotated[Optional[dict[str, Any]], Shallow] = None
    truncation: Optional[str] = None
    include: Optional[list[str]] = None
    top_logprobs: Optional[Integer] = Field(default=None, ge=0, le=20)
    max_tool_calls: Optional[Integer] = None
    background: Optional[Flag] = None
    conversation: Annotated[Any, Shallow] = None
    prompt: Annotated[Any, Shallow] = None


class ResponseMemory:
    """The conversations of the responses the Proxy produced, per session, the newest ``per_session``.

    Each entry is the message list a follow-up with ``previous_response_id`` continues: that
    response's input (without instructions) and its assistant reply as recorded.
    """

    def __init__(self, per_session: int = 256) -> None:
        self.per_session = int(per_session)
        self._sessions: dict[str, OrderedDict[str, list[dict[str, Any]]]] = {}

    def remember(self, session_id: str, response_id: str, messages: list[dict[str, Any]]) -> None:
        kept = self._sessions.setdefault(session_id, OrderedDict())
        kept[response_id] = list(messages)
        kept.move_to_end(response_id)
        while len(kept) > self.per_session:
            kept.popitem(last=False)

    def recall(self, session_id: str, response_id: str) -> list[dict[str, Any]]:
        kept = self._sessions.get(session_id) or {}
        if response_id not in kept:
            raise UnknownResponseError(
                f"previous_response_id {response_id!r} is not a stored response of session {session_id} "
                f"(responses created with store=false, in another session or before a restart are not kept; "
                f"the newest {self.per_session} per session are)")
        return [dict(m) for m in kept[response_id]]

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        return sum(len(v) for v in self._sessions.values())


# --------------------------------------------------------------------- request -> chat
def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise UnsupportedParameterError(where, "content must be a string or a list of content parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            out.append(str(part.get("text") or ""))
        elif kind == "refusal":
            out.append(str(part.get("refusal") or ""))
        else:
            raise UnsupportedParameterError(f"{where}.content[{j}]", f"content part type {kind!r} is not supported "
                                            f"(text parts only: input_text, output_text, refusal)")
    return "".join(out)


def _reasoning_text(item: dict[str, Any]) -> str | None:
    parts = item.get("content") or item.get("summary") or []
    texts = [str(p.get("text") or "") for p in parts if isinstance(p, dict)]
    return "\n".join(texts) if texts else None


def input_messages(items: Union[str, list[dict[str, Any]]], where: str = "input") -> list[dict[str, Any]]:
    """Chat messages of Responses input items (a string is one user message)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}] if items else []
    out: list[dict[str, Any]] = []
    reasoning: str | None = None  # a reasoning item belongs to the assistant turn that follows it
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise UnsupportedParameterError(f"{at}.role", f"role {role!r} is not one of user, system, developer, "
                                                f"assistant")
            msg: dict[str, Any] = {"role": role, "content": _text(item.get("content"), at)}
            if role == "assistant" and reasoning is not None:
                msg["reasoning_content"], reasoning = reasoning, None
            out.append(msg)
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
                raise UnsupportedParameterError(at, "a function_call item needs a name and a call_id")
            namespace = item.get("namespace")
            if namespace is not None and not isinstance(namespace, str):
                raise UnsupportedParameterError(f"{at}.namespace", "must be a string")
            check_arguments(item.get("arguments"), f"{at}.arguments")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": qualified_name(namespace, item["name"]),
                                 "arguments": item.get("arguments") or "{}"}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and reasoning is None:
                last.setdefault("tool_calls", []).append(call)
                if last["content"] == "":
                    last["content"] = None
            else:
                msg = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning is not None:
                    msg["reasoning_content"], reasoning = reasoning, None
                out.append(msg)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise UnsupportedParameterError(at, "a function_call_output item needs a call_id")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": _text(item.get("output"), at)})
        elif kind == "reasoning":
            reasoning = _reasoning_text(item)
        else:
            raise UnsupportedParameterError(
                f"{at}.type", f"input item type {kind!r} is not supported (message, function_call, "
                f"function_call_output, reasoning)")
    return out


NAMESPACE_SEPARATOR = "."
"""Between a namespace and a function name in what the model sees (``multi_agent_v1.spawn_agent``): OpenAI
function names cannot hold it, so a qualified name never collides with a plain function's."""


def qualified_name(namespace: str | None, name: str) -> str:
    """The name the model sees for function ``name`` of ``namespace`` (its own name outside a namespace)."""
    return name if not namespace else f"{namespace}{NAMESPACE_SEPARATOR}{name}"


def tool_namespaces(tools: list[dict[str, Any]] | None) -> dict[str, tuple[str, str]]:
    """Qualified name -> (namespace, function name) of every function of the request's namespace tools."""
    out: dict[str, tuple[str, str]] = {}
    for tool in tools or ():
        if tool.get("type") == "namespace" and isinstance(tool.get("name"), str):
            for fn in tool.get("tools") or ():
                if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                    out[qualified_name(tool["name"], fn["name"])] = (tool["name"], fn["name"])
    return out


def _chat_function(tool: dict[str, Any], at: str, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    check_function(tool, at)
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    if namespace is not None:
        fn["name"] = qualified_name(namespace["name"], tool["name"])
        if namespace.get("description"):  # the group's purpose, which the model sees nowhere else
            fn["description"] = "\n\n".join(filter(None, (fn.get("description"), namespace["description"])))
    return {"type": "function", "function": fn}


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Chat ``tools`` of Responses function and namespace tools; a hosted tool type is refused by name."""
    if not tools:
        return None
    out, named = [], []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function":
            out.append(_chat_function(tool, f"tools[{i}]"))
            named.append(f"tools[{i}].name")
        elif kind == "namespace":
            name, group = tool.get("name"), tool.get("tools")
            check_name(name, f"tools[{i}].name", "namespace tool")
            if NAMESPACE_SEPARATOR in name:
                raise UnsupportedParameterError(f"tools[{i}].name", f"a namespace tool needs a name without "
                                                                    f"{NAMESPACE_SEPARATOR!r}")
            if not isinstance(group, list) or not group:
                raise UnsupportedParameterError(f"tools[{i}].tools", "a namespace tool needs a list of function "
                                                                     "tools")
            for j, fn in enumerate(group):
                inner = fn.get("type") if isinstance(fn, dict) else None
                if inner != "function":
                    raise UnsupportedParameterError(f"tools[{i}].tools[{j}].type", f"tool type {inner!r} is not "
                                                    f"served inside a namespace; only function tools are")
                out.append(_chat_function(fn, f"tools[{i}].tools[{j}]", tool))
                named.append(f"tools[{i}].tools[{j}].name")
        else:
            raise refuse_tool_type(kind, f"tools[{i}].type", "function and namespace tools are served")
    check_unique_names(zip((t["function"]["name"] for t in out), named))
    return out


def chat_tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": qualified_name(choice.get("namespace"), choice["name"])}}
    kind = choice.get("type") if isinstance(choice, dict) else choice
    raise UnsupportedParameterError("tool_choice", f"{kind!r} is not supported (none, auto, required or "
                                                   f'{{"type": "function", "name": ...}})')


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    """The chat ``response_format`` of ``text.format`` (the chat path enforces or refuses it)."""
    fmt = (req.text or {}).get("format")
    if fmt is None:
        return None
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    return dict(fmt)


def conversation(req: ResponsesRequest, history: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The chat messages of ``req`` after ``history`` and how many of them are instructions."""
    if isinstance(req.instructions, str):
        instr = [{"role": "system", "content": req.instructions}] if req.instructions else []
    else:
        instr = input_messages(req.instructions or [], "instructions")
    return instr + history + input_messages(req.input), len(instr)


def chat_body(req: ResponsesRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat request body equivalent to ``req`` (validated by the chat schema afterwards)."""
    RESPONSES_PARAMS.check(request_fields(req))
    logprobs = bool(req.top_logprobs) or LOGPROBS_INCLUDE in (req.include or ())
    body: dict[str, Any] = {"model": req.model, "messages": messages, "tools": chat_tools(req.tools),
                            "tool_choice": chat_tool_choice(req.tool_choice), "temperature": req.temperature,
                            "top_p": req.top_p, "max_tokens": req.max_output_tokens, "stream": req.stream,
                            "parallel_tool_calls": req.parallel_tool_calls, "response_format": _response_format(req),
                            "logprobs": logprobs or None, "top_logprobs": req.top_logprobs or None}
    return {k: v for k, v in body.items() if v is not None}


# --------------------------------------------------------------------- chat -> Response
def item_ids(completion_id: str) -> tuple[str, str, str, str]:
    """Response, reasoning, message and function-call id stems of one chat completion id."""
    stem = completion_id.split("-", 1)[-1]
    return f"resp_{stem}", f"rs_{stem}", f"msg_{stem}", f"fc_{stem}"


def _text_logprobs(logprobs: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Chat ``choices[].logprobs`` as ``output_text.logprobs`` (every generated token of the reply)."""
    return [{"token": e["token"], "bytes": e["bytes"], "logprob": e["logprob"],
             "top_logprobs": [{"token": t["token"], "bytes": t["bytes"], "logprob": t["logprob"]}
                              for t in e.get("top_logprobs") or ()]}
            for e in (logprobs or {}).get("content") or ()]


def output_items(message: dict[str, Any], completion_id: str, *, incomplete: bool = False,
                 keep_message: bool = False, logprobs: dict[str, Any] | None = None,
                 namespaces: dict[str, tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    """The Response output items of a recorded assistant message (reasoning, message, function calls).

    ``namespaces`` (:func:`tool_namespaces`) turns a call of a namespaced function into its
    namespace and own name."""
    _, rs_id, msg_id, fc_id = item_ids(completion_id)
    status = "incomplete" if incomplete else "completed"
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content") is not None:
        items.append({"id": rs_id, "type": "reasoning", "status": "completed", "summary": [],
                      "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}]})
    calls = message.get("tool_calls") or []
    text = message.get("content") or ""
    if text or keep_message or not calls:
        items.append({"id": msg_id, "type": "message", "role": "assistant", "status": status,
                      "content": [{"type": "output_text", "text": text, "annotations": [],
                                   "logprobs": _text_logprobs(logprobs)}]})
    for i, call in enumerate(calls):
        item = {"id": f"{fc_id}_{i}", "type": "function_call", "status": "completed", "call_id": call["id"],
                "name": call["function"]["name"], "arguments": call["function"]["arguments"]}
        namespaced = (namespaces or {}).get(item["name"])
        if namespaced is not None:
            item["namespace"], item["name"] = namespaced
        items.append(item)
    return items


def response_object(req: ResponsesRequest, completion: dict[str, Any] | None, *, completion_id: str, created: int,
                    model: str, keep_message: bool = False, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Response of a chat completion (``None``: the in-progress or, with ``error``, failed one)."""
    resp: dict[str, Any] = {
        "id": item_ids(completion_id)[0], "object": "response", "created_at": created, "model": model,
        "status": "in_progress", "output": [], "usage": None, "error": error, "incomplete_details": None,
        "instructions": req.instructions, "tools": list(req.tools or []), "tool_choice": req.tool_choice or "auto",
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "temperature": req.temperature, "top_p": req.top_p, "max_output_tokens": req.max_output_tokens,
        "previous_response_id": req.previous_response_id, "store": req.store is not False,
        "metadata": dict(req.metadata or {}), "text": req.text or {"format": {"type": "text"}},
        "truncation": "disabled", "reasoning": {"effort": None, "summary": None}, "background": False,
        "user": None, "top_logprobs": req.top_logprobs,
    }
    if error is not None:
        resp["status"] = "failed"
    if completion is None:
        return resp
    choice = completion["choices"][0]
    incomplete = choice["finish_reason"] == "length"
    usage = completion["usage"]
    resp.update(
        status="incomplete" if incomplete else "completed", completed_at=created,
        incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
        output=output_items(choice["message"], completion_id, incomplete=incomplete, keep_message=keep_message,
                            logprobs=choice.get("logprobs"), namespaces=tool_namespaces(req.tools)),
        usage={"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
               "total_tokens": usage["total_tokens"],
               "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
               "output_tokens_details": {"reasoning_tokens": 0}})
    return resp
