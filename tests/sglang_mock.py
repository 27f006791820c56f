"""An SGLang server (and its router) on an httpx mock transport, answering in SGLang 0.5.x's wire shapes.

Shapes follow tests/fixtures/sglang (see docs/compat-facts.md): ``/generate`` answers with
``meta_info.weight_version`` and, when asked, base64 int32 ``routed_experts``; ``/abort_request``
aborts every request whose rid *starts with* the given rid (SGLang's rule); a request aborted while
it waits answers like ``_handle_abort_req`` (no ``prompt_tokens``, no ``routed_experts``, the ids so
far). A router lists its workers at ``GET /workers``, does not take ``/abort_request`` itself, and
forwards ``/generate`` without the R3 fields and ``logit_bias`` (``ROUTER_DROPS``).
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import zlib

import httpx
import numpy as np

from dressage.fields.sglang import encode_routed_experts_b64

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "sglang"


ROUTER_DROPS = ("return_routed_experts", "routed_experts_start_len", "logit_bias")
"""The ``/generate`` fields sglang-router drops when it rebuilds a body for a worker."""


def routing_row(token: int, position: int, layers: int, topk: int, experts: int) -> np.ndarray:
    """The routing SGLang would capture at ``position`` (a pure function, so a resume can be checked)."""
    return ((token * 7 + position * 3 + np.arange(layers)[:, None] * 5 + np.arange(topk)[None, :] * 11)
            % experts).astype(np.int32)


class _Pending:
    def __init__(self, rid: str, worker: str) -> None:
        self.rid, self.worker = rid, worker
        self.aborted = False
        self.wake = asyncio.Event()


class MockSGLang:
    """One or more SGLang workers, optionally behind a router at ``router``.

    ``hold``: rids starting with any of these prefixes wait (queued) until :meth:`release` or an
    abort. ``versions``: each worker's ``weight_version``. ``api_key``: the ``--api-key`` every
    call must carry. ``down``: workers that refuse connections (the router still lists them healthy).
    """

    def __init__(self, workers=("http://10.0.0.1:30001",), *, router: str | None = None, layers=4, topk=2,
                 experts=16, tokens_per_call=3, api_key: str | None = None, model_info: dict | None = None) -> None:
        self.workers, self.router = list(workers), router
        self.layers, self.topk, self.experts = layers, topk, experts
        self.tokens_per_call, self.api_key = tokens_per_call, api_key
        self.versions = {w: "default" for w in self.workers}
        self.model_info = model_info or {"model_path": "/models/tiny", "tokenizer_path": "byte", "is_generation": True,
                                         "weight_version": "default", "num_hidden_layers": layers,
                                         "num_experts_per_tok": topk, "num_experts": experts}
        self.requests: list[dict] = []   # every request: origin, path, body, headers
        self.pending: dict[str, _Pending] = {}
        self.hold: set[str] = set()
        self.hold_all = False
        self.down: set[str] = set()
        self.arrived = asyncio.Event()

    # ------------------------------------------------------------------ control from tests
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def release(self) -> None:
        self.hold.clear()
        self.hold_all = False
        for p in self.pending.values():
            p.wake.set()

    def calls(self, path: str, origin: str | None = None) -> list[dict]:
        return [r for r in self.requests if r["path"] == path and (origin is None or r["origin"] == origin)]

    async def until_pending(self, n: int = 1) -> None:
        while len(self.pending) < n:
            self.arrived.clear()
            await self.arrived.wait()

    # ------------------------------------------------------------------ the servers
    async def handle(self, request: httpx.Request) -> httpx.Response:
        origin = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        body = json.loads(request.content) if request.content else {}
        path = request.url.path
        self.requests.append({"origin": origin, "path": path, "body": body, "headers": dict(request.headers)})
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return httpx.Response(401, json={"error": {"message": "Invalid API Key"}})
        if origin == self.router:
            if path == "/workers":
                return httpx.Response(200, json=self._workers())
            if path == "/abort_request":
                return httpx.Response(404, json={"detail": "Not Found"})
            if path == "/generate":  # the router keeps a routing key on one worker
                key = request.headers.get("x-smg-routing-key", body.get("rid", ""))
                # ... and rebuilds the body, without the fields it does not know (as sglang-router 0.3 does)
                body = {k: v for k, v in body.items() if k not in ROUTER_DROPS}
                return await self._generate(self.workers[zlib.crc32(key.encode()) % len(self.workers)], body)
            if path in ("/model_info", "/get_model_info"):
                return httpx.Response(200, json=self.model_info)
            return httpx.Response(404, json={"detail": "Not Found"})
        if origin not in self.workers or origin in self.down:
            raise httpx.ConnectError(f"nothing listens on {origin}")
        if path == "/generate":
            return await self._generate(origin, body)
        if path == "/abort_request":
            self._abort(origin, body)
            return httpx.Response(200, json={})
        if path in ("/model_info", "/get_model_info"):
            return httpx.Response(200, json={**self.model_info, "weight_version": self.versions[origin]})
        if path == "/get_weight_version":
            return httpx.Response(200, json={"weight_version": self.versions[origin]})
        if path == "/update_weight_version":
            self.versions[origin] = body["new_version"]
            return httpx.Response(200, json={"success": True, "message": "ok"})
        if path == "/health":
            return httpx.Response(200)
        return httpx.Response(404, json={"detail": "Not Found"})

    def _workers(self) -> dict:
        body = json.loads((FIXTURES / "router_workers.json").read_text())
        body.pop("_shape", None)
        names = {"WORKER_A": self.workers[0], "WORKER_B": self.workers[1] if len(self.workers) > 1 else "http://10.9.9.9:1",
                 "WORKER_DOWN": "http://10.0.0.3:1"}
        for w in body["workers"]:
            w["url"] = names.get(w["url"], w["url"])
        return body

    def _abort(self, worker: str, body: dict) -> None:
        rid, everything = body.get("rid", ""), body.get("abort_all", False)
        for p in self.pending.values():
            if p.worker == worker and (everything or (rid and p.rid.startswith(rid))):  # SGLang's prefix rule
                p.aborted = True
                p.wake.set()

    def _held(self, rid: str) -> bool:
        return self.hold_all or any(rid.startswith(h) for h in self.hold)

    async def _generate(self, worker: str, body: dict) -> httpx.Response:
        rid = body.get("rid") or f"auto-{len(self.requests)}"
        ids = list(body["input_ids"])
        budget = int(body.get("sampling_params", {}).get("max_new_tokens", self.tokens_per_call))
        version = self.versions[worker]
        if self._held(rid):
            p = self.pending[rid] = _Pending(rid, worker)
            self.arrived.set()
            try:
                while not p.aborted and self._held(rid):
                    p.wake.clear()
                    await p.wake.wait()
            finally:
                self.pending.pop(rid, None)
            if p.aborted:  # aborted while waiting in the queue
                meta = {"id": rid, "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
                        "weight_version": version, "e2e_latency": 0.01, "completion_tokens": 0}
                if body.get("return_logprob"):
                    meta["output_token_logprobs"] = []
                return httpx.Response(200, json={"text": "", "output_ids": [], "meta_info": meta})
            version = self.versions[worker]
        n = min(budget, self.tokens_per_call)
        out = [100 + (len(ids) + i) % 50 for i in range(n)]
        finish = {"type": "length", "length": n} if n == budget else {"type": "stop", "matched": out[-1]}
        meta = {"id": rid, "finish_reason": finish, "prompt_tokens": len(ids), "weight_version": version,
                "completion_tokens": n, "cached_tokens": 0, "num_retractions": 0, "e2e_latency": 0.01}
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[-0.1 * (i + 1), t, None] for i, t in enumerate(out)]
        if body.get("return_routed_experts"):
            full = ids + out
            start = int(body.get("routed_experts_start_len", 0))
            rows = np.stack([routing_row(full[p], p, self.layers, self.topk, self.experts)
                             for p in range(start, len(full) - 1)])
            meta["routed_experts"] = encode_routed_experts_b64(rows)
        return httpx.Response(200, json={"text": "", "output_ids": out, "meta_info": meta})
