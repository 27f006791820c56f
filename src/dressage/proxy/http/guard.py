"""The Proxy's request guard: an ASGI middleware in front of every route.

Before a route runs it checks, in this order:

- **tokens**: ``/health`` and the session viewer's page (static; the data it polls is admin) are
  open; admin endpoints (:data:`ADMIN_PREFIXES`: trajectory read and drain, the TransferQueue spec,
  pause / resume, discard, engines, the viewer's data) need the admin token; every other endpoint takes the
  agent token or the admin token. With only one token configured it opens everything (the
  single-token setup). A missing or wrong token is 401, an agent token on an admin endpoint 403.
- **body size on the bytes received**: a declared ``Content-Length`` over the limit is refused at
  once, and the bytes of any body (chunked ones too) are counted as they arrive: 413 as soon as
  the count passes ``max_body_bytes``, without buffering the rest.
- **values nothing downstream can store**: a JSON body with a lone UTF-16 surrogate (``"\\ud800"``,
  not encodable as UTF-8) or a non-finite number (``NaN``, ``Infinity``, ``1e999``) is 400
  ``invalid_value``. Bodies are scanned with one regular expression; only a body that may hold
  such a value is parsed (strictly) a second time. A JSON text inside a string (a tool call's
  ``arguments``) is the route's to read and check (:mod:`dressage.proxy.function_tools`).

Each refusal is a :class:`dressage.errors.RequestRejected` answered in the OpenAI error form (in
Anthropic's on the Messages endpoints, whose clients send their token as ``x-api-key``): :func:`rejection`,
which also words the server's answer to headers over ``max_header_bytes`` (:class:`HeadersTooLargeError`)
and to a request the HTTP parser refused (:class:`BadHttpRequestError`), both sent before any route sees
the request; see :class:`dressage.proxy.http.app.ProxyServer`.
"""

from __future__ import annotations

import hmac
import json
import re
from typing import Any, Awaitable, Callable

from dressage.errors import (AuthenticationError, BodyTooLargeError, InputValueError, PermissionDeniedError,
                             RequestRejected)
from dressage.proxy.anthropic.protocol import dressage_error_object, is_anthropic_path
from dressage.proxy.json_values import lone_surrogate
from dressage.proxy.openai.streaming import error_payload

__all__ = ["RequestGuard", "ADMIN_PREFIXES", "is_admin_path", "check_json_values", "rejection"]

ADMIN_PREFIXES = ("/trajectory/", "/transfer_queue/", "/v1/rollout/", "/v1/engines", "/engines", "/session/discard",
                  "/admin/", "/v1/weights", "/update_weight", "/metrics")
"""Path prefixes of the trainer's (admin) endpoints; a session's own ``/sessions/{id}/discard`` too.
``/metrics`` is one: with an admin token set, a scraper sends it (Prometheus ``authorization``)."""

OPEN_PATHS = ("/health", "/admin/viewer")

_SUSPECT = re.compile(rb"\\u[dD][89a-fA-F]|NaN|Infinity|[eE]\+?[0-9]{3}|[0-9]{300}")
_BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def is_admin_path(path: str) -> bool:
    """Whether ``path`` is a trainer (admin) endpoint."""
    if path.startswith(ADMIN_PREFIXES):
        return True
    return path.startswith("/sessions/") and path.rstrip("/").endswith("/discard")


def _reject_constant(name: str) -> Any:
    raise InputValueError(f"request body: {name} is not a JSON number (non-finite values are refused)")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise InputValueError(f"request body: the number {text[:40]} overflows a 64-bit float")
    return value


def check_json_values(body: bytes) -> None:
    """Raise :class:`InputValueError` when ``body`` (JSON) holds a lone surrogate or a non-finite number.

    Malformed JSON passes: the route's own parser reports it.
    """
    if not _SUSPECT.search(body):
        return
    try:
        value = json.loads(body, parse_constant=_reject_constant, parse_float=_finite_float)
    except InputValueError:
        raise
    except (ValueError, RecursionError):
        return
    surrogate = lone_surrogate(value)
    if surrogate is not None:
        raise InputValueError(f"request body: a string holds a lone UTF-16 surrogate ({surrogate}), which is "
                              "not valid Unicode text")


def _bearer(scope: Scope) -> str:
    """The bearer token, or an ``x-api-key`` header's (how Anthropic clients send their key)."""
    api_key = ""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            text = value.decode("latin-1")
            return text[7:].strip() if text[:7].lower() == "bearer " else ""
        if name == b"x-api-key":
            api_key = value.decode("latin-1").strip()
    return api_key


def _same(given: str, token: str | None) -> bool:
    return token is not None and hmac.compare_digest(given.encode("utf-8", "replace"), token.encode("utf-8"))


class RequestGuard:
    """``app`` behind token checks, a received-bytes body limit and the JSON value check.

    ``on_reject(exc)`` is told of every refusal (the service counts them as failed calls).
    """

    def __init__(self, app: Any, *, agent_token: str | None, admin_token: str | None, max_body_bytes: int,
                 on_reject: Callable[[RequestRejected], None] | None = None) -> None:
        self.app = app
        self.agent_token, self.admin_token = agent_token, admin_token
        self.limit = int(max_body_bytes)
        self.on_reject = on_reject

    def authorize(self, scope: Scope) -> None:
        path = scope.get("path", "")
        if path in OPEN_PATHS or (self.agent_token is None and self.admin_token is None):
            return
        given = _bearer(scope)
        admin = is_admin_path(path)
        if self.admin_token is None:  # one token for everything
            if not _same(given, self.agent_token):
                raise AuthenticationError("missing or wrong bearer token")
            return
        if _same(given, self.admin_token):
            return
        if admin:
            if _same(given, self.agent_token):
                raise PermissionDeniedError(f"{path} is a trainer endpoint: it needs the admin token")
            raise AuthenticationError("missing or wrong bearer token (this endpoint needs the admin token)")
        if self.agent_token is not None and not _same(given, self.agent_token):
            raise AuthenticationError("missing or wrong bearer token")

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.isdigit():
                    raise RequestRejected(f"Content-Length {value[:40].decode('latin-1')!r} is not a number")
                if int(value) > self.limit:
                    raise BodyTooLargeError(f"request body over {self.limit} bytes")
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                raise BodyTooLargeError(f"request body over {self.limit} bytes")
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self.authorize(scope)
            if scope.get("method") not in _BODY_METHODS:
                await self.app(scope, receive, send)
                return
            body = await self._read_body(scope, receive)
            check_json_values(body)
        except _Disconnected:
            return
        except RequestRejected as exc:
            if self.on_reject is not None:
                self.on_reject(exc)
            await _answer(send, exc, scope.get("path", ""))
            return
        await self.app(scope, replay_body(body, receive), send)


class _Disconnected(Exception):
    pass


def replay_body(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the disconnect, whenever it comes

    return replay


def rejection(exc: RequestRejected, path: str | None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The answer to a refused request for ``path``: its status, headers (no ``content-length``) and JSON body,
    the OpenAI error object, or Anthropic's on the Messages endpoints (``path`` ``None``: not known)."""
    anthropic = path is not None and is_anthropic_path(path)
    data = json.dumps(dressage_error_object(exc) if anthropic else error_payload(exc)).encode()
    headers = [(b"content-type", b"application/json"), (b"x-should-retry", b"false")]
    if isinstance(exc, AuthenticationError):
        headers.append((b"www-authenticate", b"Bearer"))
    return exc.http_status, headers, data


async def _answer(send: Send, exc: RequestRejected, path: str) -> None:
    status, headers, data = rejection(exc, path)
    headers.append((b"content-length", str(len(data)).encode()))
    if isinstance(exc, BodyTooLargeError):
        headers.append((b"connection", b"close"))  # the rest of the body is not read
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
