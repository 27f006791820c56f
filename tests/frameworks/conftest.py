"""Real agent frameworks against the real Proxy and built-in engine over loopback.

The engine calls a tool on every user turn and answers in prose after tool results
(``tool_call_rate=1``, ``answer_tool_results``), so each framework's loop runs one function
tool round trip and then ends with a final answer. Every HTTP exchange between a framework
and the Proxy passes through a :class:`CallLog` (httpx event hooks on the framework's own
client): it keeps each answer's status and the ``usage`` the Proxy reported, streamed or not.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from dressage.fields import get_model
from dressage.testing.stack import start_engine, start_proxy

MODEL = get_model("tiny-moe")

# Before any framework is imported: litellm (under mini-swe-agent) reads its bundled price list
# instead of downloading one at import, and mini-swe-agent starts without its banner.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")


@dataclass
class CallLog:
    """What the Proxy answered to one framework: (method, path, status) and each answer's usage."""

    exchanges: list[tuple[str, str, int]] = field(default_factory=list)
    usages: list[dict[str, Any]] = field(default_factory=list)
    stream_errors: list[dict[str, Any]] = field(default_factory=list)

    def _note(self, response: httpx.Response) -> None:
        request = response.request
        self.exchanges.append((request.method, request.url.path, response.status_code))
        kind = response.headers.get("content-type", "")
        if kind.startswith("application/json"):
            body = json.loads(response.content)
            if isinstance(body, dict) and isinstance(body.get("usage"), dict):
                self.usages.append(body["usage"])
        elif kind.startswith("text/event-stream"):
            for line in response.text.splitlines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                if isinstance(event, dict) and ("error" in event or event.get("type") in ("error", "response.failed")):
                    self.stream_errors.append(event)  # a failure after the 200 status line
                if isinstance(event, dict) and event.get("type") == "response.completed":
                    event = event.get("response")  # a Responses stream: usage is in the final Response
                usage = event.get("usage") if isinstance(event, dict) else None
                if isinstance(usage, dict):
                    self.usages.append(usage)

    def hook(self, response: httpx.Response) -> None:
        response.read()  # buffered: the framework then reads the same body (or stream) from memory
        self._note(response)

    async def ahook(self, response: httpx.Response) -> None:
        await response.aread()
        self._note(response)

    def client(self, **kw: Any) -> httpx.Client:
        kw.setdefault("event_hooks", {"response": [self.hook]})
        return httpx.Client(timeout=30, **kw)

    def async_client(self, **kw: Any) -> httpx.AsyncClient:
        kw.setdefault("event_hooks", {"response": [self.ahook]})
        return httpx.AsyncClient(timeout=30, **kw)

    @property
    def completion_tokens(self) -> int:
        """Sum of ``usage.completion_tokens`` (chat) or ``usage.output_tokens`` (Responses)."""
        return sum(int(u.get("completion_tokens", u.get("output_tokens", 0))) for u in self.usages)

    def errors(self) -> list[Any]:
        """Answers with an error status, and error events inside streamed answers."""
        return [e for e in self.exchanges if e[2] >= 400] + self.stream_errors


@dataclass
class ProxySession:
    """One Proxy session a framework runs in: its OpenAI base URL and the log of its calls."""

    proxy_url: str
    session_id: str
    base_url: str
    headers: dict[str, str] = field(default_factory=dict)
    """Headers the framework must send (``X-Session-Id`` when the base URL is the Proxy's ``/v1``)."""
    log: CallLog = field(default_factory=CallLog)

    def finish(self) -> list[dict[str, Any]]:
        """Finalize the session and return its Segments' summaries."""
        fin = httpx.post(f"{self.proxy_url}/sessions/{self.session_id}/finalize", json={"reward": 1.0}, timeout=30)
        assert fin.status_code == 200, fin.text
        segs = httpx.get(f"{self.proxy_url}/sessions/{self.session_id}/segments", timeout=30)
        assert segs.status_code == 200, segs.text
        return segs.json()

    def check_run(self, *, linear: bool | None, min_calls: int = 2) -> list[dict[str, Any]]:
        """The checks every framework run must pass; returns the session's Segments.

        No HTTP error (nor an error event inside a stream); every call recorded once; the loss masks
        count exactly the completion tokens ``usage`` reported; each Segment's R3 rows are its
        tokens - 1 and its logprobs its response length.

        ``linear``: each request extends the previous reply, so the session is one Segment;
        ``False``: the framework rewrites or drops earlier turns, so there are several, each after
        the first labelled by how it leaves the earlier ones (never ``new_session``); ``None``:
        either.
        """
        assert self.log.errors() == []
        prefix = httpx.URL(self.base_url).path.rstrip("/") + "/"
        calls = [e for e in self.log.exchanges if e[1].startswith(prefix) and e[0] == "POST"]
        assert len(calls) >= min_calls and len(self.log.usages) == len(calls)
        segments = self.finish()
        reasons = [s["boundary_reason"] for s in segments]
        assert reasons[0] == "new_session" and "new_session" not in reasons[1:]
        if linear is not None:
            assert len(segments) == 1 if linear else len(segments) > 1, reasons
        steps = [i for s in segments for i in s["step_ids"]]
        assert len(set(steps)) == len(calls)
        # Every generated token is trained exactly once: the loss masks count what usage reported.
        assert sum(sum(s["loss_mask"]) for s in segments) == self.log.completion_tokens > 0
        for s in segments:
            # R3 covers every position but the last (T - 1 rows); logprobs every response token.
            fields = s["large_fields"]
            assert fields["routed_experts"]["rows"] == len(s["tokens"]) - 1, fields
            assert fields["logprobs"]["rows"] == s["response_length"] == len(s["loss_mask"]), fields
        return segments


@pytest.fixture(scope="session")
def fw_engine():
    srv = start_engine(model=MODEL, seed=5, tool_call_rate=1.0, answer_tool_results=True, mean_response_tokens=40)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def fw_proxy(fw_engine):
    with start_proxy(fw_engine.url, model=MODEL, request_timeout_s=30) as proxy:
        yield proxy


@pytest.fixture
def new_session(fw_proxy):
    """Opens a Proxy session per call: ``POST /sessions`` and its base URL, or (``by_header``) the
    Proxy's ``/v1`` with an ``X-Session-Id`` header, the session then created by its first call."""
    def open_session(sample_index: int = 0, *, by_header: bool = False) -> ProxySession:
        if by_header:
            sid = f"fw-{secrets.token_hex(8)}"
            return ProxySession(fw_proxy.url, sid, fw_proxy.url + "/v1", headers={"X-Session-Id": sid})
        r = httpx.post(fw_proxy.url + "/sessions", timeout=30,
                       json={"metadata": {"group_index": 0, "sample_index": sample_index}})
        assert r.status_code == 200, r.text
        body = r.json()
        return ProxySession(fw_proxy.url, body["session_id"], body["base_url"])
    return open_session


@pytest.fixture
def session(new_session) -> ProxySession:
    return new_session()
