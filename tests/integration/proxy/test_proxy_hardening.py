"""Every HTTP input path of the Proxy is typed: hostile bodies, headers and engine answers give a 4xx
(or a typed 502 for the engine's fault), nothing is recorded half-way, and state stays bounded."""

import json
import socket

import httpx
import pytest

from dressage.dataplane import DataPlaneConfig
from dressage.errors import ConfigError, SessionLimitError
from dressage.fields import get_model
from dressage.proxy.config import AccessConfig, ProxyConfig, ServerConfig, SessionsConfig
from dressage.proxy.recording.core import ProxyCore
from dressage.proxy.recording.session_caps import SessionKeeper
from dressage.proxy.engines.sglang_client import SGLangClient
from dressage.testing.stack import start_proxy
from dressage_bench.faults.hostile import MODES, STREAM_MODES

MODEL = get_model("tiny-moe")
MSG = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}



def _serve(engine_url, **server):
    """A Proxy without R3 in front of the hostile engine, whose SGLang client has a 10 s timeout."""
    return start_proxy(engine_url, r3=False, request_timeout_s=10, engine=SGLangClient(engine_url, timeout=10),
                       **server)


@pytest.fixture(scope="module")
def proxy(hostile):
    with _serve(hostile.url, max_body_bytes=1 << 16) as stack:
        yield stack


def _steps(proxy):
    return sum(len(s.steps) for s in proxy.service.core.sessions.values())


def _sid(url, **kw):
    return httpx.post(url + "/sessions", **kw).json()["session_id"]


@pytest.mark.parametrize("mode", MODES)
def test_a_bad_engine_answer_is_a_typed_502_and_records_nothing(proxy, hostile, mode):
    hostile.mode = mode
    before = _steps(proxy)
    sid = _sid(proxy.url)
    r = httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions", json=MSG, timeout=20)
    assert r.status_code == 502, r.text
    assert r.json()["error"]["type"] in ("engine_error", "engine_output_invalid")
    g = httpx.post(f"{proxy.url}/sessions/{sid}/generate", json={"input_ids": [1, 2]}, timeout=20)
    assert g.status_code == 502, g.text
    assert _steps(proxy) == before
    hostile.mode = "ok"
    ok = httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions", json=MSG, timeout=20)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "Hi"
    assert _steps(proxy) == before + 1


@pytest.mark.parametrize("mode", STREAM_MODES)
def test_a_bad_chunk_mid_stream_ends_with_an_error_event_then_done(proxy, hostile, mode):
    hostile.mode = mode
    before = _steps(proxy)
    sid = _sid(proxy.url)
    with httpx.stream("POST", f"{proxy.url}/sessions/{sid}/v1/chat/completions", json={**MSG, "stream": True},
                      timeout=20) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    hostile.mode = "ok"
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["error"]["type"] in ("engine_error", "engine_output_invalid"), last
    assert _steps(proxy) == before


BAD_BODIES = [
    ("/sessions/{sid}/v1/chat/completions", b'{"messages":[{"role":"user","content":"a\\ud800b"}],"max_tokens":4}', 400),
    ("/sessions/{sid}/v1/chat/completions", b'{"messages":[{"role":"user","content":"\\udfff"}],"max_tokens":4}', 400),
    ("/sessions", b'{"metadata":{"k":"x\\udc00"}}', 400),
    ("/sessions", b'{"metadata":{"\\ud800":1}}', 400),
    ("/sessions", b'{"metadata":{"k":NaN}}', 400),
    ("/sessions/{sid}/finalize", b'{"reward": NaN}', 400),
    ("/sessions/{sid}/finalize", b'{"reward": -Infinity}', 400),
    ("/sessions/{sid}/finalize", b'{"reward": 1e999}', 400),
    ("/sessions/{sid}/generate", b'{"input_ids":[1,2],"sampling_params":{"max_new_tokens":"abc"}}', 422),
    ("/sessions/{sid}/generate", b'{"input_ids":[1,2],"sampling_params":{"max_new_tokens":true}}', 422),
    ("/v1/rollout/resume", b'{"weight_version": 2147483648}', 400),
]


@pytest.mark.parametrize("path, body, status", BAD_BODIES)
def test_values_nothing_can_store_are_refused_before_anything_is_recorded(proxy, hostile, path, body, status):
    hostile.mode = "ok"
    sid = _sid(proxy.url)
    httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions", json=MSG, timeout=20).raise_for_status()
    sessions, steps = len(proxy.service.core.sessions), _steps(proxy)
    r = httpx.post(proxy.url + path.format(sid=sid), content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert (len(proxy.service.core.sessions), _steps(proxy)) == (sessions, steps)
    assert proxy.service.core.sessions[sid].state == "active"
    # emoji as a surrogate *pair* are valid text, and still accepted
    ok = httpx.post(f"{proxy.url}/sessions", content=b'{"metadata":{"k":"\\ud83d\\ude00"}}',
                    headers={"content-type": "application/json"})
    assert ok.status_code == 200
    read = httpx.get(f"{proxy.url}/sessions/{ok.json()['session_id']}")
    assert read.json()["metadata"] == {"k": "\N{GRINNING FACE}"}
    # the server is still fine: after a weight version it refused, calls still work
    assert httpx.post(f"{proxy.url}/sessions/{sid}/v1/chat/completions", json=MSG, timeout=20).status_code == 200


def test_header_ids_over_the_limit_are_400_and_create_nothing(proxy, hostile):
    hostile.mode = "ok"
    n = len(proxy.service.core.sessions)
    for headers in ({"x-session-id": "hdr-a", "x-instance-id": "9" * 5000},
                    {"x-session-id": "s" * 300}, {"x-session-id": "hdr-b", "x-turn-id": "t" * 1000}):
        r = httpx.post(f"{proxy.url}/v1/chat/completions", json=MSG, headers=headers, timeout=20)
        assert r.status_code == 400, r.text
    big = httpx.post(f"{proxy.url}/v1/chat/completions", json=MSG, timeout=20,
                     headers={"x-session-id": "hdr-c", "x-instance-id": "9" * 30})
    assert big.status_code == 200
    assert proxy.service.core.sessions["hdr-c"].metadata["group_index"] < -1
    assert len(proxy.service.core.sessions) == n + 1


def test_a_failed_first_call_creates_no_session_and_its_retry_works(proxy, hostile):
    hostile.mode = "nan_logprob"
    headers = {"x-session-id": "first-fails"}
    r = httpx.post(f"{proxy.url}/v1/chat/completions", json=MSG, headers=headers, timeout=20)
    assert r.status_code == 502 and "first-fails" not in proxy.service.core.sessions
    hostile.mode = "stream_nan"
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json={**MSG, "stream": True}, headers=headers,
                      timeout=20) as s:
        list(s.iter_lines())
    assert "first-fails" not in proxy.service.core.sessions
    bad = httpx.post(f"{proxy.url}/v1/chat/completions", json={"messages": []}, headers=headers, timeout=20)
    assert bad.status_code == 422 and "first-fails" not in proxy.service.core.sessions
    hostile.mode = "ok"
    r = httpx.post(f"{proxy.url}/v1/chat/completions", json=MSG, headers=headers, timeout=20)
    assert r.status_code == 200 and len(proxy.service.core.sessions["first-fails"].steps) == 1
    hostile.mode = "oov_token"                  # a later failure keeps the session and its step
    assert httpx.post(f"{proxy.url}/v1/chat/completions", json=MSG, headers=headers, timeout=20).status_code == 502
    assert len(proxy.service.core.sessions["first-fails"].steps) == 1
    hostile.mode = "ok"


def test_body_limit_counts_the_bytes_received_chunked_too(proxy):
    limit = proxy.service.config.server.max_body_bytes
    n = len(proxy.service.core.sessions)

    def chunks():
        for _ in range(8):
            yield b" " * (limit // 4)           # no Content-Length: Transfer-Encoding chunked

    r = httpx.post(proxy.url + "/sessions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    declared = httpx.post(proxy.url + "/sessions", content=b"{" + b" " * limit + b"}",
                          headers={"content-type": "application/json"})
    assert declared.status_code == 413
    small = httpx.post(proxy.url + "/sessions", content=iter([b'{"metadata":', b' {"a": 1}}']),
                       headers={"content-type": "application/json"})
    assert small.status_code == 200 and len(proxy.service.core.sessions) == n + 1


def _closed_within(sock, seconds):
    """Whether the server closes ``sock`` (recv gives b"") before ``seconds`` pass."""
    sock.settimeout(seconds)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
            if b"HTTP/1.1" in data and b"\r\n\r\n" in data:
                continue  # an answer: keep reading until the close
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


def test_slow_headers_and_slow_bodies_are_cut_off(hostile):
    server = _serve(hostile.url, server=ServerConfig(header_timeout_s=0.3, body_timeout_s=0.3, keep_alive_timeout_s=30))
    try:
        host, port = server.url[7:].rsplit(":", 1)
        silent = socket.create_connection((host, int(port)))      # connects, sends nothing
        partial = socket.create_connection((host, int(port)))     # half a request line, then nothing
        partial.sendall(b"POST /sessions HTTP/1.1\r\nHost: x\r\n")
        slow_body = socket.create_connection((host, int(port)))   # headers, then a body that never ends
        slow_body.sendall(b"POST /sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 1000\r\n\r\n{")
        assert _closed_within(silent, 20) and _closed_within(partial, 20) and _closed_within(slow_body, 20)
        for s in (silent, partial, slow_body):
            s.close()
        # a normal client is unaffected, and a big header block is 400 rather than buffered
        assert httpx.post(server.url + "/sessions").status_code == 200
        try:
            status = httpx.get(server.url + "/health", headers={"x-pad": "p" * (128 * 1024)}).status_code
        except httpx.TransportError:
            status = "closed"  # the server answered 400 and closed while the client was still sending
        assert status in (400, "closed")
        assert httpx.get(server.url + "/health").status_code == 200
    finally:
        server.close()


_PROXY_REFUSED = {  # what is wrong -> (its code, the bytes sent for a path; None: no request line)
    "too large": ("headers_too_large",
                  lambda path: (f"POST {path} HTTP/1.1\r\nHost: x\r\nX-Pad: {'p' * 32768}\r\n\r\n".encode()
                                if path else b"\x16\x03\x01" + b"p" * 32768)),
    "bad header": ("bad_http_request",
                   lambda path: (f"POST {path} HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n".encode()
                                 if path else b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40)),
    "bad chunk": ("bad_http_request",
                  lambda path: f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               f"Transfer-Encoding: chunked\r\n\r\nzz\r\n{{}}\r\n".encode()),
}


@pytest.mark.parametrize("what, path, anthropic", [
    ("too large", "/v1/chat/completions", False), ("too large", "/sessions/s1/v1/messages", True),
    ("too large", "/health", False), ("too large", None, False),
    ("bad header", "/v1/chat/completions", False), ("bad header", "/sessions/s1/v1/messages", True),
    ("bad header", None, False),
    ("bad chunk", "/v1/chat/completions", False), ("bad chunk", "/sessions/s1/v1/messages", True)])
def test_a_request_refused_before_any_route_is_a_json_error_in_the_proxys_shape(hostile, what, path, anthropic):
    """Headers over the limit and a request the HTTP parser cannot read (its head, or its body's framing) are
    answered by the connection in the Proxy's error shape (Anthropic's on the Messages endpoints, the
    OpenAI one where no path is known), counted once as a failed call; the connection is closed."""
    code, sent = _PROXY_REFUSED[what]
    server = _serve(hostile.url, server=ServerConfig(max_header_bytes=8 * 1024))
    try:
        host, port = server.url[7:].rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            try:
                sock.sendall(sent(path))
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed while sending: the answer came first
            sock.settimeout(10)
            got = b""
            while data := sock.recv(65536):
                got += data
        head, _, body = got.partition(b"\r\n\r\n")
        status, *lines = head.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines)
        assert status == "HTTP/1.1 400 Bad Request" and headers["content-type"] == "application/json"
        assert headers["connection"] == "close" and headers["x-should-retry"] == "false"
        message = ("request line and headers over 8192 bytes" if code == "headers_too_large" else
                   "malformed HTTP request: its request line, a header or its body's framing (chunk sizes, "
                   "Content-Length) is not HTTP/1.1")
        if anthropic:
            assert json.loads(body) == {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
        else:
            assert json.loads(body) == {"error": {"message": message, "type": "invalid_request_error", "param": None,
                                                  "code": code}}
        assert server.service.book.failed_by == {(400, code): 1}
        assert httpx.get(server.url + "/health").status_code == 200  # the next connection is served
        assert server.service.book.failed_by == {(400, code): 1} and not server.service.core.sessions
    finally:
        server.close()


def test_agent_and_admin_tokens(hostile, tmp_path):
    (tmp_path / "agent").write_text("agent-secret\n")
    server = _serve(hostile.url,
                    access=AccessConfig(api_token_file=str(tmp_path / "agent"), admin_token="admin-secret"))
    url = server.url
    agent, admin = {"authorization": "Bearer agent-secret"}, {"authorization": "Bearer admin-secret"}
    try:
        hostile.mode = "ok"
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.post(url + "/sessions").status_code == 401
        assert httpx.post(url + "/sessions", headers={"authorization": "Bearer wrong"}).status_code == 401
        sid = httpx.post(url + "/sessions", headers=agent).json()["session_id"]
        assert httpx.post(f"{url}/sessions/{sid}/v1/chat/completions", json=MSG, headers=agent,
                          timeout=20).status_code == 200
        assert httpx.post(f"{url}/sessions/{sid}/finalize", json={"reward": 1}, headers=agent).status_code == 200
        for method, path in (("POST", "/trajectory/read"), ("GET", "/trajectory/stats"),
                             ("GET", "/transfer_queue/spec"), ("POST", "/v1/rollout/resume"), ("GET", "/v1/engines")):
            r = httpx.request(method, url + path, headers=agent, json={} if method == "POST" else None)
            assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error", path
            assert httpx.request(method, url + path).status_code == 401
        read = httpx.post(url + "/trajectory/read", json={"drain": True}, headers=admin)
        assert read.status_code == 200 and [t["session_id"] for t in read.json()["trajectories"]] == [sid]
        assert httpx.post(url + "/sessions", headers=admin).status_code == 200   # admin opens agent endpoints
    finally:
        server.close()


def test_token_configuration():
    with pytest.raises(ConfigError, match="reachable from other machines"):
        ProxyConfig(server=ServerConfig(host="0.0.0.0"))
    with pytest.raises(ConfigError, match="reachable"):
        ProxyConfig(server=ServerConfig(host="10.1.2.3"), access=AccessConfig(admin_token="only-admin"))
    assert ProxyConfig(server=ServerConfig(host="0.0.0.0"), access=AccessConfig(api_token="t")).access.api_token == "t"
    with pytest.raises(ConfigError, match="both set"):
        AccessConfig(api_token="a", api_token_file="/nonexistent")
    with pytest.raises(ConfigError, match="cannot read"):
        AccessConfig(api_token_file="/nonexistent/token")
    with pytest.raises(ConfigError, match="same as"):
        AccessConfig(api_token="same", admin_token="same")


def test_token_from_environment_not_argv(monkeypatch):
    import argparse

    from dressage.cli.proxy import proxy_config, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    monkeypatch.setenv("DRESSAGE_PROXY_TOKEN", "env-agent")
    monkeypatch.setenv("DRESSAGE_ADMIN_TOKEN", "env-admin")
    args = parser.parse_args(["proxy", "serve", "--engine-url", "http://127.0.0.1:1"])
    cfg = proxy_config(args)
    assert (cfg.access.api_token, cfg.access.admin_token) == ("env-agent", "env-admin")


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_idle_sessions_are_evicted_and_the_cap_holds():
    core = ProxyCore(DataPlaneConfig(model=MODEL, use_rollout_routing_replay=False, enable_transfer_queue=False), None)
    clock, gone = _Clock(), []
    running = {}
    keeper = SessionKeeper(core, timeout_s=60, max_sessions=3, on_evict=gone.append, clock=clock,
                           busy=lambda sid: running.get(sid, 0))
    sids = []
    for _ in range(3):
        keeper.admit()
        sids.append(core.create_session().session_id)
        keeper.touch(sids[-1])
        clock.now += 10
    with pytest.raises(SessionLimitError, match=r"idle ones are evicted after 60 s"):
        keeper.admit()                                   # at the cap, nobody idle long enough
    keeper.timeout_s = 0                                 # --session-timeout 0: nobody is ever evicted
    with pytest.raises(SessionLimitError, match=r"idle ones are never evicted: --session-timeout 0"):
        keeper.admit()
    keeper.timeout_s = 60
    running[sids[0]] = 1
    clock.now += 75                                      # all idle over 60 s, but sids[0] has a call in flight
    keeper.admit()
    assert gone == sids[1:] and core.session(sids[0]).state == "active"
    assert all(sid not in core.sessions for sid in sids[1:]) and keeper.evicted == 2
    assert len(keeper) == 1
    running.clear()
    keeper.touch(sids[0])                                # its call recorded (a use): idle from then on
    clock.now += 61
    keeper.admit()
    assert gone == sids[1:] + sids[:1] and len(keeper) == 0
    s = core.create_session().session_id
    keeper.touch(s)
    core.abort(s)                                        # finished elsewhere: drops out of the count
    keeper.max_sessions = 1
    keeper.admit()
    assert len(keeper) == 0 and keeper.evicted == 3


def test_session_timeout_evicts_over_http(hostile):
    server = _serve(hostile.url, sessions=SessionsConfig(session_timeout_s=600, max_sessions=2))
    clock = server.service.book.keeper.clock = _Clock()       # idle time without waiting for it
    try:
        hostile.mode = "ok"
        sids = [_sid(server.url) for _ in range(2)]
        httpx.post(f"{server.url}/sessions/{sids[0]}/v1/chat/completions", json=MSG, timeout=20).raise_for_status()
        full = httpx.post(server.url + "/sessions")
        assert full.status_code == 429 and full.json()["error"]["code"] == "too_many_sessions"
        clock.now += 601
        assert httpx.post(server.url + "/sessions").status_code == 200
        for sid in sids:
            assert 400 <= httpx.get(f"{server.url}/sessions/{sid}").status_code < 500
            assert sid not in server.service.core.sessions
        assert server.service.stats()["evicted_sessions"] == 2
    finally:
        server.close()
