"""The agents' side of the Proxy's HTTP contract: session endpoints (httpx) and chat calls (openai).

Every failure is translated here into :class:`dressage.errors.AgentError` subclasses, so the
session loop handles one family of errors whatever library raised them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import httpx
import openai

from dressage.errors import (AgentError, ConfigError, ProxyConnectionError, ProxyReplyError, ProxyStatusError,
                             ProxyTimeout)

__all__ = ["ProxyClient", "ChatReply", "ToolCall", "error_kind", "parse_completion"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChatReply:
    """One chat completion as the agent uses it."""

    message: dict[str, Any]
    """The assistant message as returned (role, content and, when present, tool_calls)."""
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int


def error_kind(exc: AgentError) -> str:
    """A short label to count errors by: ``status_502``, ``timeout``, ``connection``, ``bad_reply``."""
    if isinstance(exc, ProxyStatusError):
        return f"status_{exc.status_code}"
    if isinstance(exc, ProxyTimeout):
        return "timeout"
    if isinstance(exc, ProxyConnectionError):
        return "connection"
    return "bad_reply"


def _status_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return body["detail"]
    return str(body)[:200]


def parse_completion(completion: Any) -> ChatReply:
    """The parts of an openai ``ChatCompletion`` the agent needs; :class:`ProxyReplyError` if any is missing."""
    choices = getattr(completion, "choices", None)
    if not choices:
        raise ProxyReplyError("the chat completion has no choices")
    choice = choices[0]
    msg = getattr(choice, "message", None)
    usage = getattr(completion, "usage", None)
    if msg is None:
        raise ProxyReplyError("the chat completion's first choice has no message")
    if usage is None or usage.prompt_tokens is None or usage.completion_tokens is None:
        raise ProxyReplyError("the chat completion has no usage (prompt_tokens, completion_tokens)")
    message: dict[str, Any] = {"role": "assistant", "content": msg.content}
    calls: list[ToolCall] = []
    if msg.tool_calls:
        message["tool_calls"] = [c.model_dump(exclude_none=True) for c in msg.tool_calls]
        for c in msg.tool_calls:
            fn = getattr(c, "function", None)
            if fn is None or not isinstance(c.id, str):
                raise ProxyReplyError("a tool call without an id or a function")
            calls.append(ToolCall(c.id, fn.name, fn.arguments))
    return ChatReply(message, tuple(calls), choice.finish_reason, int(usage.prompt_tokens),
                     int(usage.completion_tokens))


class ProxyClient:
    """One shared httpx client for the session endpoints and one connection pool for all chat calls."""

    def __init__(self, proxy_url: str, *, token: str | None = None, timeout_s: float = 120.0,
                 max_connections: int = 64) -> None:
        if not isinstance(proxy_url, str) or not proxy_url.startswith(("http://", "https://")):
            raise ConfigError(f"proxy_url must be http(s)://host:port, got {proxy_url!r}")
        self.proxy_url = proxy_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.http = httpx.AsyncClient(base_url=self.proxy_url, headers=headers, timeout=timeout_s, limits=limits)
        # max_retries=0: a silent client-side retry would record a second call the agent never decided to make.
        self._openai = openai.AsyncOpenAI(base_url=self.proxy_url + "/v1", api_key=token or "none",
                                          max_retries=0, timeout=timeout_s)

    async def _post(self, path: str, body: Mapping[str, Any] | None = None) -> Any:
        try:
            response = await self.http.post(path, json=dict(body) if body is not None else None)
        except httpx.TimeoutException as exc:
            raise ProxyTimeout(f"POST {path}: no answer from the Proxy in time") from exc
        except httpx.TransportError as exc:
            raise ProxyConnectionError(f"POST {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise ProxyStatusError(f"POST {path}: {response.status_code}: {_status_message(response)}",
                                   status_code=response.status_code)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise ProxyReplyError(f"POST {path}: the answer is not JSON") from exc

    async def create_session(self, metadata: Mapping[str, Any]) -> tuple[str, str]:
        """``POST /sessions``; returns (session id, the session's OpenAI base URL)."""
        body = await self._post("/sessions", {"metadata": dict(metadata)})
        sid = body.get("session_id") if isinstance(body, dict) else None
        base_url = body.get("base_url") if isinstance(body, dict) else None
        if not isinstance(sid, str) or not sid or not isinstance(base_url, str) or not base_url:
            raise ProxyReplyError(f"POST /sessions: expected session_id and base_url, got {body!r}")
        if base_url.startswith("/"):
            base_url = self.proxy_url + base_url
        return sid, base_url

    async def finalize(self, session_id: str, reward: float | None) -> Any:
        return await self._post(f"/sessions/{session_id}/finalize", {"reward": reward})

    async def abort(self, session_id: str) -> Any:
        return await self._post(f"/sessions/{session_id}/abort")

    def chat_client(self, base_url: str) -> openai.AsyncOpenAI:
        """An ``AsyncOpenAI`` client on the session's base URL, sharing the connection pool."""
        return self._openai.with_options(base_url=base_url)

    @staticmethod
    async def complete(chat: openai.AsyncOpenAI, *, model: str, messages: Sequence[Mapping[str, Any]],
                       tools: Sequence[Mapping[str, Any]] | None, temperature: float, max_tokens: int,
                       seed: int | None = None) -> ChatReply:
        """One ``chat.completions.create`` call, errors translated."""
        extra: dict[str, Any] = {}
        if tools:
            extra["tools"] = list(tools)
        if seed is not None:
            extra["seed"] = seed
        try:
            completion = await chat.chat.completions.create(
                model=model, messages=list(messages), temperature=temperature, max_tokens=max_tokens, **extra)
        except openai.APITimeoutError as exc:
            raise ProxyTimeout("chat.completions: no answer from the Proxy in time") from exc
        except openai.APIConnectionError as exc:
            raise ProxyConnectionError(f"chat.completions: {exc}") from exc
        except openai.APIStatusError as exc:
            raise ProxyStatusError(f"chat.completions: {exc.status_code}: {exc.message}",
                                   status_code=exc.status_code) from exc
        except openai.APIError as exc:
            raise ProxyReplyError(f"chat.completions: {exc}") from exc
        return parse_completion(completion)

    async def aclose(self) -> None:
        await self.http.aclose()
        await self._openai.close()

    async def __aenter__(self) -> "ProxyClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
