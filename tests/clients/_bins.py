"""Helpers of the real agent-CLI tests: the npm-installed binaries, a scratch HOME, the engine + Proxy stack
on the real Qwen3 tokenizer, and a relay in front of the Proxy that keeps each exchange (status, request
body, reported usage) so a test can check what the CLI was answered and what was recorded."""

from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from dressage.engine.core import Engine
from dressage.engine import core as engine_core
from dressage.testing.stack import ProxyStack, start_engine, start_proxy

from clients.conftest import find_cli, run_cli  # noqa: F401  (run_cli: the tests take it from here)

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / ".deps" / "agent-clients"
"""Where ``npm install --prefix .deps/agent-clients @openai/codex @qwen-code/qwen-code opencode-ai`` puts them."""
SERVED_MODEL = "qwen3-local"


def client_bin(name: str) -> str:
    """The path of CLI ``name`` (``codex``, ``qwen``, ``opencode``); the test skips when it is not installed."""
    return str(find_cli(name))


def scratch_env(tmp: Path, **extra: str) -> dict[str, str]:
    """An environment whose HOME and XDG folders are under ``tmp`` (nothing of the real user's is read)."""
    home = tmp / "home"
    dirs = {"HOME": home, "XDG_CONFIG_HOME": home / ".config", "XDG_DATA_HOME": home / ".local" / "share",
            "XDG_CACHE_HOME": home / ".cache", "XDG_STATE_HOME": home / ".local" / "state"}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "TZ", "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS") if k in os.environ}
    return {**keep, **{k: str(v) for k, v in dirs.items()}, "NO_COLOR": "1", "CI": "1", **extra}


@dataclass
class Exchange:
    method: str
    path: str
    status: int
    request: Any
    """The request's JSON body (``None`` when it had none)."""
    usage: dict[str, Any] | None
    errors: list[Any]
    """Error events inside a streamed answer with status 200."""


@dataclass
class CallLog:
    exchanges: list[Exchange] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def model_calls(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.method == "POST" and e.path.rstrip("/").endswith(
            ("/chat/completions", "/responses", "/messages"))]

    def failures(self) -> list[tuple[str, str, int, list[Any]]]:
        return [(e.method, e.path, e.status, e.errors) for e in self.exchanges
                if (e.status >= 400 and e.method != "GET") or e.errors]

    @property
    def completion_tokens(self) -> int:
        return sum(int(e.usage.get("completion_tokens", e.usage.get("output_tokens", 0)))
                   for e in self.model_calls() if e.usage)


def _usage_and_errors(kind: str, body: bytes) -> tuple[dict[str, Any] | None, list[Any]]:
    if kind.startswith("application/json"):
        data = json.loads(body) if body else None
        return (data.get("usage") if isinstance(data, dict) else None), []
    usage, errors = None, []
    for line in body.decode("utf-8", "replace").splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[len("data: "):])
        if not isinstance(event, dict):
            continue
        if "error" in event and event.get("error") or event.get("type") in ("error", "response.failed"):
            errors.append(event)
        if event.get("type") in ("response.completed", "response.incomplete"):
            event = event["response"]
        if isinstance(event.get("usage"), dict):
            usage = event["usage"]
    return usage, errors


@contextmanager
def relay(target: str) -> Iterator[tuple[str, CallLog]]:
    """A loopback HTTP server that forwards every request to ``target`` and answers what it answered (whole, not
    streamed: the CLIs read a complete event stream the same), logging each exchange. Yields (its URL, the log)."""
    log = CallLog()
    client = httpx.Client(base_url=target, timeout=300)

    class Handler(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            n = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(n) if n else b""
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in ("host", "content-length", "connection", "accept-encoding")}
            answer = client.request(self.command, self.path, content=body, headers=headers)
            kind = answer.headers.get("content-type", "")
            usage, errors = _usage_and_errors(kind, answer.content) if answer.status_code < 400 else (None, [])
            try:
                request = json.loads(body) if body else None
            except ValueError:
                request = body.decode("utf-8", "replace")
            with log.lock:
                log.exchanges.append(Exchange(self.command, self.path.split("?")[0], answer.status_code, request,
                                              usage, errors))
            self.send_response(answer.status_code)
            for k, v in answer.headers.items():
                if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                    self.send_header(k, v)
            self.send_header("content-length", str(len(answer.content)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(answer.content)

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _forward

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", log
    finally:
        server.shutdown()
        server.server_close()
        client.close()


@contextmanager
def qwen3_stack(tokenizer: Any, *, seed: int = 7) -> Iterator[ProxyStack]:
    """The built-in engine and a Proxy on the real Qwen3 tokenizer, R3 recorded. The engine calls a tool on each
    user turn and answers in prose after tool results, so an agent's task is one tool round trip, then done."""
    engine = start_engine(seed=seed, tokenizer="qwen3", tool_call_rate=1.0, answer_tool_results=True,
                          mean_response_tokens=24, make_engine=lambda config: Engine(config, tokenizer))
    try:
        with start_proxy(engine.url, tokenizer=tokenizer, tokenizer_name="qwen3", served_model_name=SERVED_MODEL,
                         request_timeout_s=120) as proxy:
            yield proxy
    finally:
        engine.stop()


def only_tools(monkeypatch: pytest.MonkeyPatch, names: set[str]) -> None:
    """The engine calls only the offered tools named in ``names`` (all of them when it offers none of those):
    a CLI's tools act on the machine, so a test picks the ones whose random arguments are harmless."""
    offered = engine_core.offered_tools

    def chosen(text: str) -> list[dict[str, Any]]:
        tools = offered(text)
        return [t for t in tools if t.get("name") in names] or tools

    monkeypatch.setattr(engine_core, "offered_tools", chosen)


def open_session(proxy: ProxyStack) -> tuple[str, str]:
    """A new Proxy session: (its id, its OpenAI base URL path ``/sessions/ID/v1``)."""
    r = httpx.post(f"{proxy.url}/sessions", json={"metadata": {}}, timeout=30)
    assert r.status_code == 200, r.text
    sid = r.json()["session_id"]
    return sid, f"/sessions/{sid}/v1"


def check_trajectory(proxy: ProxyStack, sid: str, log: CallLog,
                     conversation: Callable[[Any], Any]) -> list[dict[str, Any]]:
    """The checks every CLI run must pass; returns the session's Segments.

    No exchange failed; one Segment per conversation (``conversation(request body)`` names the conversation a
    model call belongs to) holding that conversation's calls; the loss masks count exactly the completion tokens
    the Proxy reported; R3 has one row per token but the last. A call whose body repeats an earlier call's
    exactly is the CLI retrying it (Qwen Code asks again after a reply with no visible text, which the engine
    gives now and then: an empty answer after its think block): the Proxy records it as a sibling root, a
    Segment of its own whose reason is ``retry``, and the conversation's later calls go on from it.
    """
    assert log.failures() == [] and proxy.service.book.failed_calls == 0
    calls = log.model_calls()
    assert calls and all(c.usage for c in calls), [(c.path, c.status) for c in calls]
    fin = httpx.post(f"{proxy.url}/sessions/{sid}/finalize", json={"reward": 1.0}, timeout=60)
    assert fin.status_code == 200, fin.text
    segments = httpx.get(f"{proxy.url}/sessions/{sid}/segments", timeout=60).json()
    conversations: dict[str, int] = {}
    asked: set[str] = set()
    retries = 0
    for c in calls:
        asking = json.dumps(c.request, sort_keys=True)
        retries += asking in asked
        asked.add(asking)
        key = json.dumps(conversation(c.request), sort_keys=True)
        conversations[key] = conversations.get(key, 0) + 1
    shape = [(s["boundary_reason"], len(s["step_ids"])) for s in segments]
    if not retries:
        assert sorted(len(s["step_ids"]) for s in segments) == sorted(conversations.values()), shape
    else:
        assert len(segments) == len(conversations) + retries, shape
        assert sum(reason == "retry" for reason, _ in shape) == retries, shape
        assert sum(n for _, n in shape) == len(calls), shape
    assert sum(sum(s["loss_mask"]) for s in segments) == log.completion_tokens > 0
    for s in segments:
        assert s["large_fields"]["routed_experts"]["rows"] == len(s["tokens"]) - 1
    return segments
