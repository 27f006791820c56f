"""``HotFirst``: the served app answers hot routes through the guard and FastRoutes before FastAPI's
layers, and gives everything else (and what FastRoutes refuses) to the FastAPI app unchanged; a hot
route answers the same through that fast path as through the FastAPI app's own route."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from types import SimpleNamespace
from unittest import mock

import httpx
import pytest
from fastapi import FastAPI, Request

from dressage.fields import get_model
from dressage.proxy.config import DataPlaneConfig, EnginesConfig, ProxyConfig
from dressage.proxy.deployment import build_service
from dressage.proxy.engines.startup import engine_clients
from dressage.proxy.http.app import HotFirst, _install_guards, build_app, fastapi_app
from sglang_mock import MockSGLang
from test_proxy_fast_routes import MSG, FakeService


def _served(token=None, crash=False):
    service = FakeService()
    service.config = SimpleNamespace(access=SimpleNamespace(api_token=token, admin_token=None),
                                     server=SimpleNamespace(max_body_bytes=4096, public_url=None))
    if crash:
        def create_session(metadata, base_url):
            raise RuntimeError("boom")
        service.create_session = create_session
    app = FastAPI()
    _install_guards(app, service)  # the same guard and error handlers as fastapi_app installs
    seen: list = []

    @app.api_route("/{rest:path}", methods=["GET", "POST"])
    async def anything(rest: str, request: Request):
        seen.append((request.method, "/" + rest, await request.body()))
        return {"app": True}

    entered: list = []
    inner = app.__call__

    async def counting(scope, receive, send):
        entered.append(scope["path"])
        await inner(scope, receive, send)

    front = HotFirst(_Counted(app, counting), service)  # the app, counting the requests that enter it
    return front, service, seen, entered


class _Counted:
    def __init__(self, app, call):
        self.root_path, self.debug, self._call = app.root_path, app.debug, call

    async def __call__(self, scope, receive, send):
        await self._call(scope, receive, send)


def _run(front, fn):
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=front, raise_app_exceptions=False),
                               base_url="http://proxy")

    async def go():
        async with client:
            return await fn(client)

    return asyncio.run(go())


def test_hot_routes_never_enter_the_fastapi_app():
    front, service, seen, entered = _served()
    rs = _run(front, lambda c: asyncio.gather(c.post("/sessions", json={"metadata": {"k": 1}}),
                                              c.post("/sessions/s1/v1/chat/completions", json=MSG)))
    assert [r.status_code for r in rs] == [200, 200]
    assert rs[0].json() == {"session_id": "s1", "base_url": "http://proxy/sessions/s1/v1"}
    assert rs[1].json()["choices"][0]["message"]["content"] == "hi"
    assert entered == [] and seen == []


def test_other_routes_and_refused_bodies_reach_the_app_as_before():
    front, service, seen, entered = _served()
    rs = _run(front, lambda c: asyncio.gather(
        c.get("/health"), c.post("/sessions/s1/generate", content=b'{"input_ids": [-1]}',
                                 headers={"content-type": "application/json"})))
    assert [r.json() for r in rs] == [{"app": True}, {"app": True}]
    assert sorted(entered) == ["/health", "/sessions/s1/generate"]
    assert ("POST", "/sessions/s1/generate", b'{"input_ids": [-1]}') in seen and service.calls == []


def test_the_guard_still_refuses_first_and_a_crash_is_a_500():
    front, service, seen, entered = _served(token="secret")
    r = _run(front, lambda c: c.post("/sessions", json={}))
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer" and entered == []
    r = _run(front, lambda c: c.post("/sessions", json={}, headers={"authorization": "Bearer secret"}))
    assert r.status_code == 200
    big = _run(front, lambda c: c.post("/sessions", content=b"{" + b" " * 5000 + b"}",
                                       headers={"authorization": "Bearer secret",
                                                "content-type": "application/json"}))
    assert big.status_code == 413 and entered == []
    front, service, seen, entered = _served(crash=True)
    r = _run(front, lambda c: c.post("/sessions", json={}))
    assert r.status_code == 500 and r.text == "Internal Server Error" and entered == []


def _hot_calls_of(fast: bool):
    """The hot routes' answers from a Proxy over a mock SGLang: through the served app's fast path
    (``fast``; nothing may enter the FastAPI app) or through the FastAPI app's own routes."""
    mock = MockSGLang()
    engines = EnginesConfig(engine_url=mock.workers[0], request_timeout_s=20)
    service, _ = build_service(ProxyConfig(data_plane=DataPlaneConfig(model=get_model("tiny-moe")), engines=engines),
                               engine=engine_clients(engines, transport=mock.transport()))
    entered: list = []
    if fast:
        app = build_app(service)
        inner = app.app

        async def counting(scope, receive, send):
            entered.append(scope["path"])
            await inner(scope, receive, send)

        app.app = _Counted(inner, counting)
    else:
        app = fastapi_app(service)
    msg = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}

    async def calls(c):
        return [await c.post("/sessions", json={"metadata": {"k": 1}}),
                await c.post("/v1/chat/completions", json=msg, headers={"x-session-id": "s1", "x-turn-id": "t1"}),
                await c.post("/sessions/s1/v1/chat/completions", json={**msg, "n": 2}),
                await c.post("/sessions/s1/generate", json={"input_ids": [1, 2, 3]}),
                await c.post("/sessions/nobody/v1/chat/completions", json=msg),
                await c.post("/sessions/s1/finalize", json={"reward": 1.0})]

    rs = _run(app, calls)
    assert entered == []
    return [(r.status_code, r.headers["content-type"], r.json()) for r in rs], service.stats()


def _same_but_ids(answer):
    """An answer with the per-call random ids and clock values taken out."""
    status, kind, body = answer
    text = json.dumps(body, sort_keys=True)
    if "base_url" in body:  # a created session: its id is random
        text = text.replace(body["session_id"], "<sid>")
    text = re.sub(r"(chatcmpl|call)[-_][0-9a-f]+", "<id>", text)
    text = re.sub(r'"finalization_id": "[0-9a-f]+"', '"finalization_id": "<id>"', text)
    return status, kind, re.sub(r'"created": ?[0-9]+', '"created": 0', text)


def test_a_hot_route_answers_the_same_through_the_fast_path_as_through_its_fastapi_route():
    fast, fast_stats = _hot_calls_of(True)
    routed, routed_stats = _hot_calls_of(False)
    assert [a[0] for a in fast] == [200, 200, 200, 200, 404, 200]
    assert [_same_but_ids(a) for a in fast] == [_same_but_ids(a) for a in routed]
    keys = ("sessions", "steps", "response_tokens", "calls", "failed_calls", "unread_trajectories")
    assert {k: fast_stats[k] for k in keys} == {k: routed_stats[k] for k in keys}
    assert fast_stats["steps"] == 4 and fast_stats["failed_calls"] == 1


class _Stalled:
    """A model call that never answers (an engine still generating) and notes when it is cancelled."""

    def __init__(self) -> None:
        self.started, self.cancelled = asyncio.Event(), []

    def call(self, kind):
        async def call(*args, **kwargs):
            self.started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(kind)
                raise
        return call


async def _hang_up(app, path, body, gone):
    """POST ``body`` to ``path`` of ``app`` and hang up once ``gone()`` returns; what the app sent."""
    messages, sent = iter([{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]), []

    async def receive():
        message = next(messages, None)
        if message is not None:
            return message
        await gone()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json"), (b"x-session-id", b"s1")],
             "scheme": "http", "server": ("proxy", 80), "client": ("agent", 1), "http_version": "1.1",
             "asgi": {"version": "3.0", "spec_version": "2.4"}}
    await asyncio.wait_for(app(scope, receive, send), 10)
    return sent


@pytest.mark.parametrize("path, body, kind", [
    ("/sessions/s1/v1/chat/completions", MSG, "chat"),
    ("/sessions/s1/generate", {"input_ids": [1, 2]}, "generate"),
    ("/sessions/s1/v1/responses", {"model": "m", "input": "hello"}, "responses"),
    ("/v1/responses", {"model": "m", "input": "hello"}, "responses"),
    ("/sessions/s1/v1/messages", {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
     "messages"),
    ("/v1/messages", {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}, "messages"),
    ("/sessions/s1/v1/completions", {"model": "m", "prompt": "hi"}, "completions"),
    ("/v1/completions", {"model": "m", "prompt": "hi"}, "completions"),
])
def test_each_model_call_route_of_the_fastapi_app_cancels_the_call_of_a_client_that_hung_up(path, body, kind):
    """The FastAPI app's routes (what a Proxy mounted under a root path serves, and the only routes of
    Responses, text completions and Anthropic Messages) watch the connection as the hot routes do: nothing
    is answered."""
    stalled, service = _Stalled(), mock.MagicMock()
    service.config.access = SimpleNamespace(api_token=None, admin_token=None)
    service.config.server.max_body_bytes = 1 << 20
    service.chat.open = stalled.call("chat")
    service.chat.generate_tokens = stalled.call("generate")
    service.responses.open = stalled.call("responses")
    service.messages.open = stalled.call("messages")
    service.completions.open = stalled.call("completions")
    sent = asyncio.run(_hang_up(fastapi_app(service), path, body, stalled.started.wait))
    assert stalled.cancelled == [kind] and sent == []


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", MSG),
    ("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3}}),
    ("/v1/completions", {"model": "m", "prompt": "hello", "max_tokens": 3}),
])
def test_a_client_that_hangs_up_while_its_call_is_recorded_leaves_it_recorded_whole(path, body):
    """A hang-up that comes once the engine answered and the step is being committed does not cut the
    recording half-way: the step and its bookkeeping (counted tokens, the session's weight version) are
    recorded whole, and the call stays in flight (finalize waits for it) until the commit is done."""
    engine = MockSGLang()
    engines = EnginesConfig(engine_url=engine.workers[0], request_timeout_s=20)
    service, _ = build_service(ProxyConfig(data_plane=DataPlaneConfig(model=get_model("tiny-moe")), engines=engines),
                               engine=engine_clients(engines, transport=engine.transport()))
    sid = service.create_session(None, "http://proxy/")["session_id"]
    committing, release = threading.Event(), threading.Event()
    begin_step = service.core.begin_step

    def held_begin_step(*args, **kwargs):  # the commit region, held until the agent has gone
        committing.set()
        assert release.wait(10)
        return begin_step(*args, **kwargs)

    service.core.begin_step = held_begin_step

    async def go():
        sent = await _hang_up(build_app(service), f"/sessions/{sid}{path}", body,
                              lambda: asyncio.to_thread(committing.wait, 10))
        in_flight = service.in_flight.running(sid)
        release.set()
        for _ in range(1000):
            if not service.in_flight.running(sid):
                break
            await asyncio.sleep(0.01)
        return sent, in_flight

    sent, in_flight = asyncio.run(go())
    assert sent == [] and in_flight == 1  # nothing answered; the commit still counted in flight
    (step,) = service.core.sessions[sid].steps.values()
    assert service.in_flight.running(sid) == 0 and service.book.generated_tokens == step.response_len > 0
