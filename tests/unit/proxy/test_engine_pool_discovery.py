"""The engine pool behind a discovery: it follows the router's list, places by load, and keeps its own
health view (a failed call takes a worker out at once; one that missed a version catches up)."""

import asyncio

import pytest

from dressage.errors import NoHealthyEngineError
from dressage.proxy.engines.pool import EnginePool
from dressage.proxy.engines.router_client import WorkerInfo


class FakeWorker:
    def __init__(self, url):
        self.base_url, self.up, self.version = url, True, "v0"

    async def health(self, timeout=5.0):
        return self.up

    async def update_weight_version(self, version, timeout=30.0):
        self.version = version
        return {"success": True}


class FakeDiscovery:
    def __init__(self, *urls):
        self.listed = [WorkerInfo(u, True, "http") for u in urls]
        self.clients: dict[str, FakeWorker] = {}

    async def workers(self):
        return list(self.listed)

    def client_for(self, url):
        return self.clients.setdefault(url, FakeWorker(url))


def test_the_pool_follows_the_list_and_spreads_new_sessions_by_load():
    d = FakeDiscovery("http://a", "http://b")
    pool = EnginePool([], discovery=d)
    with pytest.raises(NoHealthyEngineError, match="none listed yet"):
        pool.place("s0")
    asyncio.run(pool.refresh())
    first = {f"s{i}": pool.place(f"s{i}").member.url for i in range(10)}
    assert sorted(first.values()).count("http://a") == 5  # by load: 5 and 5
    d.listed.append(WorkerInfo("http://c", True, "http"))  # added at run time
    asyncio.run(pool.refresh())
    new = {pool.place(f"n{i}").member.url for i in range(5)}
    assert new == {"http://c"}  # the least loaded takes the new sessions
    assert all(pool.place(sid).member.url == url for sid, url in first.items())  # old ones stay


def test_a_removed_worker_moves_its_sessions_but_keeps_its_running_calls_in_the_control_targets():
    d = FakeDiscovery("http://a", "http://b")
    pool = EnginePool([], discovery=d)
    asyncio.run(pool.refresh())
    on_b = next(sid for sid in (f"s{i}" for i in range(10)) if pool.place(sid).member.url == "http://b")
    pool.members["http://b"].in_flight = 1
    d.listed = d.listed[:1]
    asyncio.run(pool.refresh())
    assert [m.url for m in pool.control_targets()] == ["http://a", "http://b"]
    placed = pool.place(on_b)
    assert placed.member.url == "http://a" and placed.moved_from == "http://b"
    pool.members["http://b"].in_flight = 0
    assert [m.url for m in pool.control_targets()] == ["http://a"]


def test_a_failed_call_takes_the_worker_out_at_once_and_a_passing_probe_brings_it_back():
    async def go():
        d = FakeDiscovery("http://a", "http://b")
        pool = EnginePool([], discovery=d)
        await pool.refresh()
        a = pool.members["http://a"]
        pool.report_failure(a.client)
        assert not a.placeable  # before any probe
        await asyncio.gather(*pool._probes)
        assert a.placeable  # the probe passed
        a.client.up = False
        pool.report_failure(a.client)
        await asyncio.gather(*pool._probes)
        assert not a.placeable and all(pool.place(f"s{i}").member.url == "http://b" for i in range(4))

    asyncio.run(go())


def test_a_worker_that_missed_a_version_takes_no_session_until_a_probe_sets_it():
    d = FakeDiscovery("http://a", "http://b")
    pool = EnginePool([], discovery=d)
    asyncio.run(pool.refresh())
    b = pool.members["http://b"]
    b.healthy, b.version_behind = False, "v2"
    assert {pool.place(f"s{i}").member.url for i in range(4)} == {"http://a"}
    asyncio.run(pool.check())
    assert b.client.version == "v2" and b.version_behind is None and b.placeable


def test_a_router_url_without_a_workers_route_is_the_one_engine():
    import httpx

    from dressage.proxy.engines.discovery import RouterDiscovery
    from dressage.proxy.engines.router_client import RouterClient

    def answer(request):
        if request.url.path == "/workers":
            return httpx.Response(404, json={"detail": "Not Found"})
        return httpx.Response(500, text="down")

    router = RouterClient("http://engine:30000", transport=httpx.MockTransport(answer))
    discovery = RouterDiscovery(router)
    assert discovery.list_blocking() == [WorkerInfo("http://engine:30000", True)]
    assert asyncio.run(discovery.workers()) == [WorkerInfo("http://engine:30000", True)]

    def broken(request):
        return httpx.Response(500, text="down")

    assert RouterDiscovery(RouterClient("http://r:1", transport=httpx.MockTransport(broken))).list_blocking() == []
