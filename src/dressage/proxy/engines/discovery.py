"""A router as the Proxy's discovery: its ``GET /workers`` tells which engines exist and their health.

With ``engines.router_mode: discovery`` the Proxy places each session on a worker itself and sends
``/generate`` straight to it (a router rebuilds ``/generate`` bodies and drops the R3 fields); the
router is only asked who the workers are. :class:`~.pool.EnginePool` follows the list it gives.
"""

from __future__ import annotations

import logging

from dressage.errors import EngineError
from dressage.proxy.engines.private_loop import run_on_private_loop
from dressage.proxy.engines.router_client import RouterClient, WorkerInfo
from dressage.proxy.engines.sglang_client import SGLangClient

__all__ = ["RouterDiscovery"]

log = logging.getLogger(__name__)

LIST_TIMEOUT_S = 5.0


class RouterDiscovery:
    """The HTTP workers ``router`` lists; a client per worker, sharing the router client's transport and key."""

    def __init__(self, router: RouterClient, *, timeout_s: float = LIST_TIMEOUT_S) -> None:
        self.router = router
        self.timeout_s = float(timeout_s)
        self._single = False

    @property
    def url(self) -> str:
        return self.router.base_url

    async def workers(self) -> list[WorkerInfo]:
        """The router's HTTP workers, healthy or not (gRPC ones cannot take our calls)."""
        return await self._ask(self.router)

    async def _ask(self, client: RouterClient) -> list[WorkerInfo]:
        try:
            return [w for w in await client.list_workers(self.timeout_s) if w.is_http]
        except EngineError as exc:
            if exc.status_code != 404:
                raise
        # No ``/workers`` route: the URL names an SGLang server itself (launch scripts pass one engine as
        # their router URL when there is one worker); it is then the one worker.
        if not self._single:
            log.warning("%s has no /workers route: serving it as the one engine", self.url)
            self._single = True
        return [WorkerInfo(self.url, healthy=True)]

    def client_for(self, url: str) -> SGLangClient:
        return self.router.worker(url)

    def list_blocking(self) -> list[WorkerInfo]:
        """The workers, asked on a private loop (before the Proxy's loop runs); ``[]`` when the router
        does not answer (the periodic refresh asks again).

        A fresh client asks, so no connection of the Proxy's own pool is bound to that loop.
        """
        async def ask() -> list[WorkerInfo]:
            client = RouterClient(self.url, timeout=self.timeout_s, api_key=self.router.api_key,
                                  transport=self.router.seed_transport())
            try:
                return await self._ask(client)
            finally:
                await client.close()

        try:
            return run_on_private_loop(ask, name="dressage-router-workers")
        except EngineError:
            return []

    async def close(self) -> None:
        await self.router.close()  # closes the worker clients it made too
