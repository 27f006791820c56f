"""``FastRoutes``: valid calls on the hot routes are answered without the router; the rest reach the app
with their body intact, so every refusal keeps the app's wording and status."""

from __future__ import annotations

import asyncio
import json

from types import SimpleNamespace

import httpx
import pytest

from dressage.errors import UnknownStepError
from dressage.proxy.http.fast_routes import FastRoutes


class FakeBook:
    """The session book's failure counter."""

    def __init__(self) -> None:
        self.failed_calls = 0

    def failed(self, exc) -> None:
        self.failed_calls += 1


class FakeService:
    """The service's face the hot routes use: sessions, ``chat`` (its serving object), ``book``, and the
    metrics and tracing the app front reads."""

    def __init__(self) -> None:
        self.book = FakeBook()
        self.metrics = SimpleNamespace(observe_call=lambda seconds, engine_s: None)
        self.tracing = None
        self.config = SimpleNamespace(server=SimpleNamespace(public_url=None))
        self.chat = SimpleNamespace(open=self.open_chat, generate_tokens=self.generate_tokens)
        self.calls: list[tuple] = []

    def create_session(self, metadata, base_url):
        self.calls.append(("create", metadata, base_url))
        return {"session_id": "s1", "base_url": base_url + "sessions/s1/v1"}

    def header_session(self, identity):
        self.calls.append(("header_session", identity.session_id))
        return identity.session_id

    async def open_chat(self, session_id, req, *, scope=None):
        self.calls.append(("chat", session_id, [m.content for m in req.messages], scope.turn_id, req.max_tokens))
        if session_id == "gone":
            raise UnknownStepError("unknown session 'gone'")
        if req.stream:
            async def frames():
                yield b"data: 1\n\n"
                yield b"data: [DONE]\n\n"
            return frames()
        return {"id": "c1", "choices": [{"message": {"role": "assistant", "content": "hi"}}]}

    async def generate_tokens(self, session_id, req):
        self.calls.append(("generate", session_id, req.input_ids))
        return {"output_ids": [7]}


class App:
    """The app behind: records what reaches it, and the body it could still read."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        self.seen.append((scope["method"], scope["path"], body))
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"app"})


def _run(fn):
    service, app = FakeService(), App()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=FastRoutes(app, service=service)),
                               base_url="http://proxy")

    async def go():
        async with client:
            return await fn(client)

    return asyncio.run(go()), service, app


MSG = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def test_valid_hot_calls_are_answered_here():
    async def calls(c):
        return [await c.post("/sessions", json={"metadata": {"k": 1}}),
                await c.post("/sessions"),  # the body is optional
                await c.post("/sessions/s1/v1/chat/completions", json=MSG, headers={"x-turn-id": "t1"}),
                await c.post("/v1/chat/completions", json=MSG, headers={"x-session-id": "s2"}),
                await c.post("/sessions/s1/generate", json={"input_ids": [1, 2]},
                             headers={"content-type": "application/vnd.x+json"})]

    rs, service, app = _run(calls)
    assert [r.status_code for r in rs] == [200] * 5 and app.seen == []
    assert rs[0].json() == {"session_id": "s1", "base_url": "http://proxy/sessions/s1/v1"}
    assert rs[2].headers["content-type"] == "application/json" and rs[2].json()["choices"][0]["message"]["content"] == "hi"
    assert rs[4].json() == {"output_ids": [7]}
    assert service.calls[0] == ("create", {"k": 1}, "http://proxy/")
    assert service.calls[1] == ("create", None, "http://proxy/")
    chat = service.calls[2]
    assert chat[:3] == ("chat", "s1", ["hello"]) and chat[3] is not None and chat[4] == 4
    assert service.calls[3:5] == [("header_session", "s2"), ("chat", "s2", ["hello"], None, 4)]
    assert service.calls[5] == ("generate", "s1", [1, 2])


@pytest.mark.parametrize("body", [b'{"metadata": {"k": 1, "k": 2}}', b'{"metadata": {"n": 9223372036854775807, "m": -9223372036854775808}}',
                                  b'{"metadata": {"s": "\\u00e9\xc3\xa9", "f": 1e-7, "x": [true, null]}}'])
def test_bodies_read_as_the_standard_library_reads_them(body):
    async def call(c):
        return await c.post("/sessions", content=body, headers={"content-type": "application/json"})

    r, service, app = _run(call)
    assert r.status_code == 200 and app.seen == []
    want = json.loads(body)["metadata"]
    assert service.calls == [("create", want, "http://proxy/")]
    assert [type(v) for v in service.calls[0][1].values()] == [type(v) for v in want.values()]


def test_metadata_beyond_int64_is_not_taken_on_the_fast_path():
    async def call(c):
        return await c.post("/sessions", content=b'{"metadata": {"n": 1180591620717411303425}}',
                            headers={"content-type": "application/json"})

    r, service, app = _run(call)
    assert service.calls == [] and len(app.seen) == 1  # the app answers it (a 400 naming metadata)


def test_a_streamed_chat_is_an_event_stream():
    async def call(c):
        return await c.post("/sessions/s1/v1/chat/completions", json={**MSG, "stream": True})

    r, _, app = _run(call)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-cache" and r.content == b"data: 1\n\ndata: [DONE]\n\n"
    assert app.seen == []


@pytest.mark.parametrize("path,body,headers", [
    ("/sessions/s1/v1/chat/completions", b'{"messages": [', {"content-type": "application/json"}),  # malformed
    ("/sessions/s1/v1/chat/completions", b'{"messages": []}', {"content-type": "application/json"}),  # schema
    ("/sessions/s1/v1/chat/completions", json.dumps(MSG).encode(), {"content-type": "text/plain"}),
    ("/sessions/s1/v1/chat/completions", json.dumps(MSG).encode(), {}),  # no content type
    ("/sessions/s1/v1/chat/completions", b"", {"content-type": "application/json"}),  # a required body
    ("/sessions/s1/generate", b'{"input_ids": [-1]}', {"content-type": "application/json"}),
    ("/sessions/s1/finalize", b'{"reward": 1, "rewrd": 2}', {"content-type": "application/json"}),  # strict
    ("/sessions", b"[1]", {"content-type": "application/json"}),
    ("/sessions", b"null", {"content-type": "application/json"}),
])
def test_what_does_not_validate_reaches_the_app_with_its_body(path, body, headers):
    async def call(c):
        return await c.post(path, content=body, headers=headers)

    r, service, app = _run(call)
    assert r.status_code == 299 and r.content == b"app"
    assert app.seen == [("POST", path, body)] and service.calls == []


@pytest.mark.parametrize("method,path", [("GET", "/sessions"), ("GET", "/sessions/s1/finalize"),
                                         ("POST", "/sessions/"), ("POST", "/sessions/a/b/finalize"),
                                         ("POST", "/sessions/s1/abort"), ("POST", "/v1/completions")])
def test_other_routes_reach_the_app(method, path):
    async def call(c):
        return await c.request(method, path, json={"x": 1} if method == "POST" else None)

    r, service, app = _run(call)
    assert r.status_code == 299 and [s[:2] for s in app.seen] == [(method, path)] and service.calls == []


def test_a_service_error_is_the_apps_error_answer():
    async def call(c):
        return await c.post("/sessions/gone/v1/chat/completions", json=MSG)

    r, service, app = _run(call)
    assert r.status_code == UnknownStepError.http_status == 404
    assert r.headers["x-should-retry"] == "false"
    assert r.json()["error"]["message"] == "unknown session 'gone'"
    assert r.json()["error"]["type"] == UnknownStepError.openai_type
    assert service.book.failed_calls == 1 and app.seen == []
