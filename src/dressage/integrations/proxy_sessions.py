"""The rollout function's side of the Proxy's session contract: create, finalize, discard, capabilities.

One pooled httpx client for the session endpoints a rollout calls around each agent; httpx and
urllib failures are translated here into :class:`dressage.errors.AgentError` subclasses.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Mapping

import httpx

from dressage.errors import ConfigError, ProxyConnectionError, ProxyReplyError, ProxyStatusError, ProxyTimeout

__all__ = ["ProxySessions", "fetch_capabilities"]


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    return str(body)[:300]


class ProxySessions:
    """Session calls to the Proxy at ``proxy_url``: ``token`` is the agents' bearer token (create,
    finalize), ``admin_token`` the trainer's (discard; ``token`` when the Proxy has one token only)."""

    def __init__(self, proxy_url: str, *, token: str | None = None, admin_token: str | None = None,
                 timeout_s: float = 120.0, max_connections: int = 64) -> None:
        if not isinstance(proxy_url, str) or not proxy_url.startswith(("http://", "https://")):
            raise ConfigError(f"proxy_url must be http(s)://host:port, got {proxy_url!r}")
        self.url = proxy_url.rstrip("/")
        self.token, self.admin_token = token, admin_token
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.http = httpx.AsyncClient(base_url=self.url, timeout=timeout_s, limits=limits)

    async def _post(self, path: str, body: Mapping[str, Any] | None, token: str | None) -> Any:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        try:
            response = await self.http.post(path, json=dict(body) if body is not None else None, headers=headers)
        except httpx.TimeoutException as exc:
            raise ProxyTimeout(f"POST {self.url}{path}: no answer from the Proxy in time") from exc
        except httpx.TransportError as exc:
            raise ProxyConnectionError(f"POST {self.url}{path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise ProxyStatusError(f"POST {self.url}{path}: {response.status_code}: {_message(response)}",
                                   status_code=response.status_code)
        try:
            return response.json()
        except ValueError as exc:
            raise ProxyReplyError(f"POST {self.url}{path}: the answer is not JSON") from exc

    async def create(self, metadata: Mapping[str, Any]) -> str:
        """``POST /sessions``; the new session's id."""
        body = await self._post("/sessions", {"metadata": dict(metadata)}, self.token)
        sid = body.get("session_id") if isinstance(body, dict) else None
        if not isinstance(sid, str) or not sid:
            raise ProxyReplyError(f"POST /sessions: expected a session_id, got {str(body)[:200]}")
        return sid

    async def finalize(self, session_id: str, reward: float, *, instance_id: str | None = None) -> Any:
        body: dict[str, Any] = {"reward": reward}
        if instance_id is not None:
            body["instance_id"] = instance_id
        return await self._post(f"/sessions/{session_id}/finalize", body, self.token)

    async def discard(self, session_id: str) -> Any:
        """``POST /session/discard``: the session (active or finalized) and its TQ keys go; a repeat is a no-op."""
        return await self._post("/session/discard", {"session_id": session_id}, self.admin_token or self.token)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> "ProxySessions":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def fetch_capabilities(proxy_url: str, *, token: str | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
    """``GET {proxy_url}/integration/capabilities``: what the Proxy records (model shape, R3, TQ); our own
    document, which the Proxy nests under ``dressage`` in upstream's."""
    req = urllib.request.Request(proxy_url.rstrip("/") + "/integration/capabilities",
                                 headers={"authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            doc = json.loads(resp.read())
        return doc.get("dressage", doc) if isinstance(doc, dict) else doc
    except urllib.error.HTTPError as exc:
        raise ProxyStatusError(f"{proxy_url}/integration/capabilities: HTTP {exc.code}",
                               status_code=exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        raise ProxyConnectionError(f"{proxy_url}/integration/capabilities: {getattr(exc, 'reason', exc)}") from None
    except ValueError as exc:
        raise ProxyReplyError(f"{proxy_url}/integration/capabilities: the answer is not JSON ({exc})") from None
