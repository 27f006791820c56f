"""SGLangClient headers and RouterClient fan-out against mock transports shaped like the real servers."""

from __future__ import annotations

import asyncio
import json
import pathlib

import httpx
import pytest

from dressage.errors import EngineUnavailable, WireFormatError
from dressage.proxy.engines.router_client import RouterClient, parse_workers
from dressage.proxy.engines.sglang_client import ROUTING_KEY_HEADER, SGLangClient

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "sglang"
ROUTER, A, B = "http://router.test:30000", "http://10.0.0.1:30001", "http://10.0.0.2:30002"


def workers_body(**urls):
    body = json.loads((FIXTURES / "router_workers.json").read_text())
    for w in body["workers"]:
        w["url"] = urls.get(w["url"], w["url"])
    return body


class Cluster:
    """A router and its workers on one mock transport; records every request by host."""

    def __init__(self, *, worker_abort_status=200, router_abort_status=404, versions=None, key="sk-engine"):
        self.seen: list[tuple[str, str, dict, dict]] = []
        self.worker_abort_status, self.router_abort_status = worker_abort_status, router_abort_status
        self.versions = versions or {A: "step-3", B: "step-3"}
        self.key = key

    def handler(self, request: httpx.Request) -> httpx.Response:
        origin = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        body = json.loads(request.content) if request.content else {}
        self.seen.append((origin, request.url.path, body, dict(request.headers)))
        if self.key and request.headers.get("authorization") != f"Bearer {self.key}":
            return httpx.Response(401, json={"error": {"message": "Invalid API Key"}})
        path = request.url.path
        if origin == ROUTER and path == "/workers":
            return httpx.Response(200, json=workers_body(WORKER_A=A, WORKER_B=B, WORKER_DOWN="http://10.0.0.3:1"))
        if path == "/abort_request":
            status = self.router_abort_status if origin == ROUTER else self.worker_abort_status
            return httpx.Response(status, json={} if status == 200 else {"detail": "Not Found"})
        if path == "/get_weight_version":
            return httpx.Response(200, json={"weight_version": self.versions[origin]})
        if path == "/update_weight_version":
            self.versions[origin] = body["new_version"]
            return httpx.Response(200, json={"success": True, "message": "ok"})
        if path == "/generate":
            return httpx.Response(200, json={"text": "", "output_ids": [], "meta_info": {"id": body.get("rid")}})
        return httpx.Response(404, json={"detail": "Not Found"})

    def client(self, cls=RouterClient):
        return cls(ROUTER, transport=httpx.MockTransport(self.handler), api_key=self.key)

    def calls(self, path):
        return [(o, b) for o, p, b, _ in self.seen if p == path]


def run(coro):
    return asyncio.run(coro)


def test_abort_fans_out_to_every_listed_http_worker_healthy_or_not():
    cluster = Cluster()

    async def go():
        async with cluster.client() as c:
            await c.abort("drabc_t0000000001_r000")

    run(go())
    aborts = cluster.calls("/abort_request")
    # The unhealthy one too (the router's health lags), not the gRPC one, not the router.
    assert sorted(o for o, _ in aborts) == [A, B, "http://10.0.0.3:1"]
    assert all(b == {"rid": "drabc_t0000000001_r000", "abort_all": False} for _, b in aborts)
    assert all(h.get("authorization") == "Bearer sk-engine" for _, p, _, h in cluster.seen)


def test_abort_falls_back_to_the_router_and_fails_when_nothing_takes_it():
    cluster = Cluster(worker_abort_status=503, router_abort_status=200)

    async def go():
        async with cluster.client() as c:
            await c.abort("r1")

    run(go())
    assert [o for o, _ in cluster.calls("/abort_request")][-1] == ROUTER
    cluster = Cluster(worker_abort_status=503, router_abort_status=404)
    with pytest.raises(EngineUnavailable, match="reached no engine"):
        run(go())


def test_abort_also_reaches_a_worker_removed_from_the_router():
    cluster = Cluster()
    gone = "http://10.0.0.7:30007"

    async def go():
        async with cluster.client() as c:
            c.worker(gone)  # a worker the client talked to before the router dropped it
            await c.abort("r9")

    run(go())
    assert gone in {o for o, _ in cluster.calls("/abort_request")}


def test_empty_rid_abort_is_refused_before_sending():
    cluster = Cluster()

    async def go(cls):
        async with cluster.client(cls) as c:
            await c.abort("")

    for cls in (SGLangClient, RouterClient):
        with pytest.raises(ValueError):
            run(go(cls))
    assert cluster.seen == []


def test_weight_versions_are_read_from_and_set_on_every_worker():
    cluster = Cluster()

    async def go():
        async with cluster.client() as c:
            before = await c.get_weight_version()
            await c.update_weight_version("step-4")
            return before, await c.weight_versions()

    before, after = run(go())
    assert before == "step-3" and after == {A: "step-4", B: "step-4"}
    cluster = Cluster(versions={A: "step-3", B: "step-4"})

    async def disagree():
        async with cluster.client() as c:
            return await c.get_weight_version()

    with pytest.raises(WireFormatError, match="different weight versions"):
        run(disagree())


def test_generate_sends_routing_key_and_api_key():
    cluster = Cluster()

    async def go():
        async with cluster.client(SGLangClient) as c:
            await c.generate([1, 2], {"max_new_tokens": 1}, rid="r", routing_key="session-9")
            await c.generate([1, 2], {"max_new_tokens": 1}, rid="r2")

    run(go())
    gens = [h for _, p, _, h in cluster.seen if p == "/generate"]
    assert gens[0][ROUTING_KEY_HEADER.lower()] == "session-9" and ROUTING_KEY_HEADER.lower() not in gens[1]
    assert gens[0]["authorization"] == "Bearer sk-engine"


def test_wrong_api_key_is_an_engine_request_error():
    cluster = Cluster()

    async def go():
        async with SGLangClient(ROUTER, transport=httpx.MockTransport(cluster.handler), api_key="wrong") as c:
            await c.generate([1], {})

    with pytest.raises(Exception, match="401"):
        run(go())


def test_model_info_falls_back_to_the_old_path():
    paths = []

    def handler(request):
        paths.append(request.url.path)
        if request.url.path == "/get_model_info":
            return httpx.Response(200, json={"model_path": "m", "tokenizer_path": "m"})
        return httpx.Response(404, json={"detail": "Not Found"})

    async def go():
        async with SGLangClient("http://e.test", transport=httpx.MockTransport(handler)) as c:
            return await c.model_info()

    assert run(go()) == {"model_path": "m", "tokenizer_path": "m"} and paths == ["/model_info", "/get_model_info"]


def test_parse_workers_accepts_both_health_keys_and_wildcard_binds():
    body = {"workers": [{"url": "0.0.0.0:31000", "healthy": True}, {"url": "http://w:1", "is_healthy": "false"},
                        {"url": ""}, "junk"]}
    ws = parse_workers(body, "http://router.test:30000")
    assert [(w.url, w.healthy, w.is_http) for w in ws] == [("http://router.test:31000", True, True),
                                                           ("http://w:1", False, True)]
    with pytest.raises(WireFormatError):
        parse_workers({"nope": []}, ROUTER)
