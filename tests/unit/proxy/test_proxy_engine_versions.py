"""The engines' own weight versions through the Proxy: ``GET /v1/engines`` reads them, and
``POST /v1/rollout/resume {"update_engines": true}`` sets them, on every worker behind a router.

Against SGLang's wire shapes (sglang_mock: ``GET /get_weight_version``,
``POST /update_weight_version``, the router's ``GET /workers``) and the built-in engine over HTTP.
"""

from __future__ import annotations

import asyncio

import httpx

from dressage.fields import get_model
from dressage.fields.versions import NAMED_BASE
from dressage.proxy.config import DataPlaneConfig, EnginesConfig, ProxyConfig, SessionsConfig
from dressage.proxy.deployment import build_service
from dressage.proxy.http.app import build_app
from dressage.proxy.engines.startup import engine_clients
from sglang_mock import MockSGLang

MODEL = get_model("tiny-moe")
W1, W2, ROUTER = "http://10.0.0.1:30001", "http://10.0.0.2:30002", "http://router.test:30000"


def make(mock=None, *, router=False, engine_url=None, engine_urls=(), router_mode="data_path"):
    """The Proxy service from the composition root, served in process over ASGI; its engines on
    ``mock``'s transport (or real HTTP when ``mock`` is None)."""
    dp = DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True)
    url = engine_url or (mock.router or mock.workers[0])
    engines = EnginesConfig(engine_url=url, engine_urls=tuple(engine_urls), router=router, request_timeout_s=20,
                            router_mode=router_mode)
    engine = engine_clients(engines, transport=mock.transport()) if mock is not None else None
    cfg = ProxyConfig(data_plane=dp, engines=engines, sessions=SessionsConfig(partial_rollout=True))
    service, _ = build_service(cfg, engine=engine)
    return service, httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(service)), base_url="http://proxy")


def chat(h, sid, text="hello"):
    return h.post("/v1/chat/completions", headers={"X-Session-Id": sid},
                  json={"messages": [{"role": "user", "content": text}], "max_tokens": 3})


def last_step(service, sid):
    s = service.core.sessions[sid]
    return s.steps[max(s.steps)]


def test_engines_report_the_version_each_engine_states_and_an_error_for_one_that_does_not_answer():
    async def go():
        mock = MockSGLang([W1, W2])
        mock.versions.update({W1: "step-3", W2: "4"})
        service, h = make(mock, engine_urls=(W1, W2))
        r = await h.get("/v1/engines")
        assert r.status_code == 200
        by_url = {e["url"]: e for e in r.json()["engines"]}
        assert by_url[W1]["weight_version"] == "step-3" and by_url[W2]["weight_version"] == "4"
        assert "weight_version_error" not in by_url[W1] and by_url[W1]["healthy"] is True
        mock.down.add(W2)
        r = await h.get("/v1/engines")
        assert r.status_code == 200
        by_url = {e["url"]: e for e in r.json()["engines"]}
        assert by_url[W1]["weight_version"] == "step-3"
        assert by_url[W2]["weight_version"] is None and W2 in by_url[W2]["weight_version_error"]
        assert "ConnectError" in by_url[W2]["weight_version_error"]
        assert [c["origin"] for c in mock.calls("/get_weight_version")].count(W1) == 2

    asyncio.run(go())


def test_behind_a_router_each_healthy_worker_is_asked_and_reported():
    async def go():
        mock = MockSGLang([W1, W2], router=ROUTER)
        mock.versions.update({W1: "7", W2: "7"})
        service, h = make(mock, router=True)
        (engine,) = (await h.get("/v1/engines")).json()["engines"]
        assert engine["url"] == ROUTER and engine["weight_version"] == "7"
        assert engine["workers"] == [{"url": W1, "weight_version": "7"}, {"url": W2, "weight_version": "7"}]
        # The unhealthy and the gRPC worker the router lists are not asked, nor is the router itself.
        assert {c["origin"] for c in mock.calls("/get_weight_version")} == {W1, W2}
        mock.versions[W2] = "8"
        (engine,) = (await h.get("/v1/engines")).json()["engines"]
        assert engine["weight_version"] is None and "different weight versions: 7, 8" in engine["weight_version_error"]
        assert [w["weight_version"] for w in engine["workers"]] == ["7", "8"]
        mock.down.add(W2)
        r = await h.get("/v1/engines")
        assert r.status_code == 200
        (engine,) = r.json()["engines"]
        assert engine["weight_version"] is None and engine["workers"][0] == {"url": W1, "weight_version": "7"}
        assert engine["workers"][1]["weight_version"] is None and W2 in engine["weight_version_error"]

    asyncio.run(go())


def test_resume_with_update_engines_sets_every_worker_and_the_next_tokens_carry_the_engine_version():
    async def go():
        mock = MockSGLang([W1, W2], router=ROUTER)
        service, h = make(mock, router=True, router_mode="discovery")
        assert (await h.post("/v1/rollout/pause")).status_code == 200
        r = await h.post("/v1/rollout/resume", json={"version": "step-7", "update_engines": True})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["paused"] is False and out["resumed"] is True and out["engines_updated"] == [W1, W2]
        assert mock.versions == {W1: "step-7", W2: "step-7"}
        updates = mock.calls("/update_weight_version")
        assert sorted(u["origin"] for u in updates) == [W1, W2]
        assert all(u["body"] == {"new_version": "step-7", "abort_all_requests": False} for u in updates)
        assert (await chat(h, "s")).status_code == 200
        step = last_step(service, "s")
        (code,) = set(step.token_versions.tolist())
        assert code >= NAMED_BASE and service.versions.table.label(code) == "step-7"
        assert step.metadata["weight_versions"] == {str(code): "step-7"}
        assert (await h.get("/v1/engines")).json()["engines"][0]["weight_version"] == "step-7"
        assert (await h.get("/integration/capabilities")).json()["dressage"]["features"]["resume_update_engines"] is True

    asyncio.run(go())


def test_a_worker_that_refuses_the_version_is_a_502_naming_it_and_the_proxy_stays_paused():
    async def go():
        mock = MockSGLang([W1, W2], router=ROUTER)
        mock.versions.update({W1: "1", W2: "1"})
        service, h = make(mock, router=True, router_mode="discovery")
        await h.post("/v1/rollout/pause")
        worker = service.engine.worker(W2)
        real = worker.update_weight_version

        async def refuse(version, **kw):
            return {"success": False, "message": "weights are loading"}

        worker.update_weight_version = refuse
        r = await h.post("/v1/rollout/resume", json={"weight_version": 2, "update_engines": True})
        assert r.status_code == 502
        err = r.json()["error"]
        assert err["type"] == "engine_error" and err["code"] == "engine_update_failed"
        assert err["details"]["updated"] == [W1] and list(err["details"]["failed"]) == [W2]
        assert W2 in err["message"] and f"updated: {W1}" in err["message"]
        state = (await h.get("/v1/rollout/pause_state")).json()
        assert state["paused"] is True and state["weight_version"] == 0
        call = asyncio.ensure_future(chat(h, "s"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not call.done() and not mock.calls("/generate")  # still held by the pause
        worker.update_weight_version = real  # the worker takes it now: the same resume goes through
        r = await h.post("/v1/rollout/resume", json={"weight_version": 2, "update_engines": True})
        assert r.status_code == 200 and r.json()["engines_updated"] == [W1, W2]
        assert (await call).status_code == 200
        assert last_step(service, "s").token_versions.tolist() == [2, 2, 2]

    asyncio.run(go())


def test_a_dead_worker_behind_a_router_is_reported_and_the_resume_goes_on():
    async def go():
        mock = MockSGLang([W1, W2], router=ROUTER)
        service, h = make(mock, router=True)
        await h.post("/v1/rollout/pause")
        mock.down.add(W2)  # the router still lists it healthy
        r = await h.post("/v1/rollout/resume", json={"weight_version": 2, "update_engines": True})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["engines_updated"] == [W1] and list(out["engines_unreachable"]) == [W2]
        assert mock.versions[W1] == "2" and mock.versions[W2] == "default"

    asyncio.run(go())


def test_in_discovery_mode_a_dead_worker_is_reported_takes_no_session_and_gets_the_version_when_back():
    async def go():
        mock = MockSGLang([W1, W2], router=ROUTER)
        service, h = make(mock, router=True, router_mode="discovery")
        assert sorted(service.engines.members) == [W1, W2, "http://10.0.0.3:1"]
        await h.post("/v1/rollout/pause")
        mock.down.add(W2)
        r = await h.post("/v1/rollout/resume", json={"weight_version": 2, "update_engines": True})
        assert r.status_code == 200, r.text
        out = r.json()
        # The worker the router lists unhealthy is probed, found down and reported with the dead one.
        assert out["engines_updated"] == [W1] and sorted(out["engines_unreachable"]) == [W2, "http://10.0.0.3:1"]
        engines = {e["url"]: e for e in (await h.get("/v1/engines")).json()["engines"]}
        assert engines[W2]["healthy"] is False and engines[W2]["version_behind"] == "2"
        for i in range(6):  # every session goes to the live worker
            assert (await chat(h, f"s{i}")).status_code == 200
        assert {g["origin"] for g in mock.calls("/generate")} == {W1}
        mock.down.clear()
        await service.engines.check()  # the probe finds it back and sets the version it missed
        assert mock.versions[W2] == "2" and service.engines.members[W2].placeable

    asyncio.run(go())


def test_without_the_flag_resume_calls_no_engine_and_the_flag_is_strict():
    async def go():
        mock = MockSGLang([W1])
        service, h = make(mock)
        await h.post("/v1/rollout/pause")
        r = await h.post("/v1/rollout/resume", json={"update_engines": "yes", "version": "3"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "update_engines"
        assert "expected true or false" in r.json()["error"]["message"]
        r = await h.post("/v1/rollout/resume", json={"update_engines": True})
        assert r.status_code == 400 and "needs a weight_version or version" in r.json()["error"]["message"]
        assert service.pause.paused
        r = await h.post("/v1/rollout/resume", json={"version": "3"})
        assert r.status_code == 200 and "engines_updated" not in r.json()
        assert not mock.calls("/update_weight_version") and mock.versions[W1] == "default"

    asyncio.run(go())


def test_the_built_in_engine_reports_and_takes_the_version():
    from dressage.engine.config import EngineConfig
    from dressage.engine.server import EngineServer

    engine = EngineServer(EngineConfig(model=MODEL, port=0, seed=1, weight_version="3"))
    url = engine.start_background()

    async def go():
        service, h = make(engine_url=url)
        (state,) = (await h.get("/v1/engines")).json()["engines"]
        assert state["url"] == url and state["weight_version"] == "3"
        assert (await chat(h, "a")).status_code == 200
        assert set(last_step(service, "a").token_versions.tolist()) == {3}
        await h.post("/v1/rollout/pause")
        r = await h.post("/v1/rollout/resume", json={"weight_version": 4, "update_engines": True})
        assert r.status_code == 200 and r.json()["engines_updated"] == [url]
        assert engine.engine.weight_version == "4"
        assert (await h.get("/v1/engines")).json()["engines"][0]["weight_version"] == "4"
        assert (await chat(h, "b")).status_code == 200
        assert set(last_step(service, "b").token_versions.tolist()) == {4}
        await service.engines.close()

    try:
        asyncio.run(go())
    finally:
        engine.stop()
