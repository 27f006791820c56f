"""``RouterClient``: an engine behind sglang-router / SGLang Model Gateway.

In ``data_path`` mode ``/generate`` goes through the router (with the session's routing key); the
calls a router does not forward reliably go to its workers directly: ``/abort_request`` is sent to
every HTTP worker listed by ``GET /workers``, healthy or not, and to any worker seen before (falling
back to the router itself when none takes it); weight versions are read from and set on each
healthy worker. In ``discovery`` mode only :meth:`RouterClient.list_workers` and :meth:`worker` are
used (:mod:`.discovery`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit, urlunsplit

from dressage.errors import EngineError, EngineUnavailable, WireFormatError
from dressage.proxy.engines.httpx_lean import httpx
from dressage.proxy.engines.httpx_transport import HttpxTransport
from dressage.proxy.engines.sglang_client import SGLangClient

UNHEALTHY_ABORT_TIMEOUT_S = 2.0
"""How long an abort waits on a worker the router lists as unhealthy (it may be gone)."""

__all__ = ["RouterClient", "WorkerInfo", "parse_workers"]


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker as the router lists it."""

    url: str
    healthy: bool
    connection_mode: str | None = None

    @property
    def is_http(self) -> bool:
        return (self.connection_mode or "http").lower() == "http" and self.url.startswith(("http://", "https://"))


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    return bool(value)


def _reachable(url: str, router_url: str) -> str:
    """A worker URL the Proxy can call: a scheme is added, a wildcard bind address becomes the router's host."""
    text = url.strip()
    if "://" not in text:
        text = f"{urlsplit(router_url).scheme or 'http'}://{text}"
    parts = urlsplit(text)
    if parts.hostname in ("0.0.0.0", "::"):
        host = urlsplit(router_url).hostname or "127.0.0.1"
        netloc = host if parts.port is None else f"{host}:{parts.port}"
        parts = parts._replace(netloc=netloc)
    return urlunsplit(parts).rstrip("/")


def parse_workers(body: Any, router_url: str) -> list[WorkerInfo]:
    """The ``workers`` of a ``GET /workers`` answer (``is_healthy`` or ``healthy``, ``connection_mode``)."""
    if not isinstance(body, Mapping) or not isinstance(body.get("workers"), list):
        raise WireFormatError(f"GET {router_url}/workers: expected {{\"workers\": [...]}}, got {str(body)[:200]!r}")
    out = []
    for w in body["workers"]:
        if not isinstance(w, Mapping) or not isinstance(w.get("url"), str) or not w["url"].strip():
            continue
        healthy = w.get("is_healthy", w.get("healthy", False))
        mode = w.get("connection_mode")
        out.append(WorkerInfo(_reachable(w["url"], router_url), _truthy(healthy),
                              None if mode is None else str(mode)))
    return out


class RouterClient(SGLangClient):
    """An :class:`SGLangClient` for a router URL whose control calls fan out to its workers."""

    is_router = True

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._workers: dict[str, SGLangClient] = {}

    async def list_workers(self, timeout: float = 10.0) -> list[WorkerInfo]:
        """``GET /workers`` of the router."""
        resp = await self._request("GET", "/workers", timeout=timeout)
        return parse_workers(self._json(resp, "GET /workers"), self.base_url)

    async def targets(self, timeout: float = 10.0) -> list[WorkerInfo]:
        """The healthy HTTP workers, the ones weight-version calls go to."""
        return [w for w in await self.list_workers(timeout) if w.healthy and w.is_http]

    def seed_transport(self) -> Any:
        """A transport another event loop may use to reach the router: a mock one (it holds no
        connections), else ``None`` (that loop opens its own)."""
        inner = getattr(self._transport, "transport", None) if isinstance(self._transport, HttpxTransport) else None
        return inner if isinstance(inner, httpx.MockTransport) else None

    def worker(self, url: str) -> SGLangClient:
        """A client for one worker, with this client's API key (kept for reuse)."""
        client = self._workers.get(url)
        if client is None:
            client = self._workers[url] = SGLangClient(url, timeout=self.timeout, api_key=self.api_key,
                                                       transport=self._transport,
                                                       max_answer_bytes=self.max_answer_bytes)
        return client

    async def abort(self, rid: str | None = None, *, abort_all: bool = False, timeout: float = 30.0) -> None:
        """Abort on every listed HTTP worker (healthy or not: the router's health lags) and every worker
        seen before (one removed from the router may still run the call); the router's own
        ``/abort_request`` only when no worker took it."""
        if not rid and not abort_all:
            raise ValueError("abort needs a non-empty rid or abort_all=True")
        errors: list[str] = []
        try:
            listed = [w for w in await self.list_workers(timeout) if w.is_http]
        except EngineError as exc:
            listed, errors = [], [f"workers list: {exc}"]
        urls = {w.url for w in listed}
        workers = listed + [WorkerInfo(url, False, "http") for url in self._workers if url not in urls]
        results = await asyncio.gather(*(self.worker(w.url).abort(
            rid, abort_all=abort_all, timeout=timeout if w.healthy else min(timeout, UNHEALTHY_ABORT_TIMEOUT_S))
            for w in workers), return_exceptions=True)
        taken = 0
        for w, r in zip(workers, results):
            if isinstance(r, EngineError):
                errors.append(f"{w.url}: {r}")
            elif isinstance(r, BaseException):
                raise r
            else:
                taken += 1
        if taken:
            return
        try:
            await super().abort(rid, abort_all=abort_all, timeout=timeout)
        except EngineError as exc:
            errors.append(f"router: {exc}")
            raise EngineUnavailable(f"abort of {rid or 'all requests'} reached no engine: {'; '.join(errors)}") from exc

    async def weight_versions(self, timeout: float = 10.0) -> dict[str, str]:
        """Each healthy worker's ``weight_version`` (every one must answer)."""
        workers = await self.targets(timeout)
        if not workers:
            raise EngineUnavailable(f"the router {self.base_url} lists no healthy HTTP worker")
        versions = await asyncio.gather(*(self.worker(w.url).get_weight_version(timeout) for w in workers))
        return dict(zip((w.url for w in workers), versions))

    async def get_weight_version(self, timeout: float = 30.0) -> str:
        """The workers' common version; :class:`WireFormatError` when they disagree."""
        versions = await self.weight_versions(timeout)
        distinct = sorted(set(versions.values()))
        if len(distinct) != 1:
            raise WireFormatError(f"the router's workers run different weight versions: {versions}")
        return distinct[0]

    async def update_weight_version(self, new_version: str, *, abort_all_requests: bool = False,
                                    timeout: float = 30.0) -> dict[str, Any]:
        """``POST /update_weight_version`` on every healthy worker."""
        workers = await self.targets(timeout)
        if not workers:
            raise EngineUnavailable(f"the router {self.base_url} lists no healthy HTTP worker")
        answers = await asyncio.gather(*(self.worker(w.url).update_weight_version(
            new_version, abort_all_requests=abort_all_requests, timeout=timeout) for w in workers))
        return {"workers": dict(zip((w.url for w in workers), answers))}

    async def close(self) -> None:
        for client in self._workers.values():
            await client.close()
        self._workers.clear()
        await super().close()
