"""Hostile input, hostile engines, slow clients, tokens and bounded state against one real Proxy.

Cases: ``hostile_inputs`` (values nothing can store, big integers with the journal on, huge
header ids, wrong parameter types), ``hostile_engine`` (bad ``/generate`` answers and bad stream
chunks: a typed 502 or an SSE error event then ``[DONE]``, nothing recorded), ``body_limit_chunked``,
``slowloris``, ``access_tokens``, ``session_caps`` and ``schema_fuzz`` (schemathesis).
"""

from __future__ import annotations

import json
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from dressage.errors import ConfigError
from dressage.proxy.config import AccessConfig, ProxyConfig, ServerConfig, SessionsConfig
from dressage_bench.faults._stack import start_engine, start_proxy
from dressage_bench.faults.hostile import MODES, STREAM_MODES, HostileEngine
from dressage_bench.faults.runner import FaultsConfig, case

MSG = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
JSON = {"content-type": "application/json"}
FAILS_IN_PREPARE = {**MSG, "tools": [{"type": "function", "function": {"name": "f"}}],
                    "tool_choice": {"type": "function", "function": {"name": "missing"}}}
"""A valid body whose call fails after the header session was looked up (no such tool)."""

# (what, method, path, body bytes, headers): each must be a 4xx that records nothing.
HOSTILE = [
    ("lone surrogate in content", "/sessions/{sid}/v1/chat/completions",
     b'{"messages":[{"role":"user","content":"a\\ud800b"}],"max_tokens":4}', {}),
    ("lone surrogate in metadata", "/sessions", b'{"metadata":{"k":"\\udc00"}}', {}),
    ("lone surrogate in a tool schema", "/sessions/{sid}/v1/chat/completions",
     b'{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"\\ud800"}}]}', {}),
    ("int >= 2^64 in metadata", "/sessions", b'{"metadata":{"k":18446744073709551616}}', {}),
    ("int >= 2^64 in tools", "/sessions/{sid}/v1/chat/completions",
     b'{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"tools":[{"type":"function",'
     b'"function":{"name":"f","parameters":{"x":18446744073709551616}}}]}', {}),
    ("5000-char X-Instance-Id", "/v1/chat/completions", json.dumps(MSG).encode(),
     {"x-session-id": "hostile-1", "x-instance-id": "9" * 5000}),
    ("300-char X-Session-Id", "/v1/chat/completions", json.dumps(MSG).encode(), {"x-session-id": "s" * 300}),
    ("max_new_tokens 'abc'", "/sessions/{sid}/generate",
     b'{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":"abc"}}', {}),
    ("NaN reward", "/sessions/{sid}/finalize", b'{"reward": NaN}', {}),
    ("Infinity reward", "/sessions/{sid}/finalize", b'{"reward": Infinity}', {}),
    ("1e999 reward", "/sessions/{sid}/finalize", b'{"reward": 1e999}', {}),
    ("NaN in metadata", "/sessions", b'{"metadata":{"x":NaN}}', {}),
    ("weight_version 2^31", "/v1/rollout/resume", b'{"weight_version": 2147483648}', {}),
    ("token id 2^31", "/sessions/{sid}/generate", b'{"input_ids":[2147483648]}', {}),
]


def _steps(stack) -> int:
    return sum(len(s.steps) for s in stack.core.sessions.values())


@case("hostile_inputs")
def hostile_inputs(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    engine = start_engine(mean_response_tokens=8)
    with tempfile.TemporaryDirectory() as tmp:
        stack = start_proxy(engine.url, journal=str(Path(tmp) / "j"), timeout_s=20)
        try:
            sid = httpx.post(stack.url + "/sessions").json()["session_id"]
            httpx.post(f"{stack.url}/sessions/{sid}/v1/chat/completions", json=MSG, timeout=30).raise_for_status()
            answers, bad = {}, []
            for what, path, body, headers in HOSTILE:
                sessions, steps = len(stack.core.sessions), _steps(stack)
                r = httpx.post(stack.url + path.format(sid=sid), content=body, headers={**JSON, **headers},
                               timeout=30)
                answers[what] = r.status_code
                if not 400 <= r.status_code < 500 or (len(stack.core.sessions), _steps(stack)) != (sessions, steps):
                    bad.append(f"{what}: {r.status_code} {r.text[:120]}")
            after = httpx.post(f"{stack.url}/sessions/{sid}/v1/chat/completions", timeout=30,
                               json={**MSG, "messages": [{"role": "user", "content": "again"}]})
            read = httpx.get(f"{stack.url}/trajectory/stats")
            valid_json = "NaN" not in read.text and "Infinity" not in read.text
        finally:
            stack.stop()
        restarted = start_proxy(engine.url, journal=str(Path(tmp) / "j"))   # the journal still replays
        try:
            replay = restarted.proxy.recovery
            replay_ok = replay.damage is None and sid in restarted.core.sessions
        finally:
            restarted.stop()
            engine.stop()
    detail = {"requests": len(HOSTILE), "not_4xx_or_recorded": len(bad), "examples": bad[:5], "statuses": answers,
              "valid_call_after": after.status_code, "reads_valid_json": valid_json, "journal_replays": replay_ok}
    return not bad and after.status_code == 200 and valid_json and replay_ok, detail


@case("hostile_engine")
def hostile_engine(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    engine = HostileEngine()
    engine.start_background()
    stack = start_proxy(engine.url, timeout_s=20, r3=False, skip_engine_check=True)  # it has no /model_info
    try:
        sid = httpx.post(stack.url + "/sessions").json()["session_id"]
        plain, streamed, bad = {}, {}, []
        for mode in MODES:
            engine.mode = mode
            steps = _steps(stack)
            r = httpx.post(f"{stack.url}/sessions/{sid}/v1/chat/completions", json=MSG, timeout=30)
            plain[mode] = r.status_code
            if r.status_code != 502 or _steps(stack) != steps:
                bad.append(f"{mode}: {r.status_code} {r.text[:120]}")
        for mode in STREAM_MODES:
            engine.mode = mode
            steps = _steps(stack)
            with httpx.stream("POST", f"{stack.url}/sessions/{sid}/v1/chat/completions",
                              json={**MSG, "stream": True}, timeout=30) as r:
                events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            ends = events[-1:] == ["[DONE]"] and len(events) >= 2 and "error" in json.loads(events[-2])
            streamed[mode] = "error event, [DONE]" if ends else f"ended with {events[-2:]}"
            if not ends or _steps(stack) != steps:
                bad.append(f"{mode}: {events[-2:]}")
        engine.mode = "ok"
        ok = httpx.post(f"{stack.url}/sessions/{sid}/v1/chat/completions", json=MSG, timeout=30)
        stored = list(stack.core.sessions[sid].steps.values())
        finite = all(float(abs(st.logprobs).max()) < float("inf") for st in stored if st.logprobs is not None)
        detail = {"answers": len(MODES) + len(STREAM_MODES), "wrong": len(bad), "examples": bad[:5],
                  "plain_statuses": plain, "streams": streamed, "valid_call_after": ok.status_code,
                  "steps_recorded": len(stored), "logprobs_finite": finite}
        return not bad and ok.status_code == 200 and len(stored) == 1 and finite, detail
    finally:
        stack.stop()
        engine.stop()


@case("body_limit_chunked")
def body_limit_chunked(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    engine = start_engine(mean_response_tokens=8)
    limit = 1 << 20
    stack = start_proxy(engine.url, server=ServerConfig(max_body_bytes=limit))
    try:
        def chunks(total):
            for _ in range(total // (64 << 10)):
                yield b" " * (64 << 10)

        n = len(stack.core.sessions)
        chunked = httpx.post(stack.url + "/sessions", content=chunks(100 << 20), headers=JSON, timeout=60)
        declared = httpx.post(stack.url + "/sessions", content=b" " * (limit + 1), headers=JSON, timeout=60)
        under = httpx.post(stack.url + "/sessions", content=iter([b'{"metadata": {"a": ', b'1}}']), headers=JSON)
        detail = {"chunked_100MiB": chunked.status_code, "declared_over": declared.status_code,
                  "chunked_small": under.status_code, "sessions_created": len(stack.core.sessions) - n}
        return (chunked.status_code == 413 and declared.status_code == 413 and under.status_code == 200
                and detail["sessions_created"] == 1), detail
    finally:
        stack.stop()
        engine.stop()


@case("slowloris")
def slowloris(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    engine = start_engine(mean_response_tokens=8)
    stack = start_proxy(engine.url, server=ServerConfig(header_timeout_s=1.0, body_timeout_s=1.0))
    host, port = stack.url[7:].rsplit(":", 1)
    socks = []
    try:
        for i in range(50):
            s = socket.create_connection((host, int(port)))
            if i % 3 == 1:
                s.sendall(b"POST /sessions HTTP/1.1\r\nHost: x\r\n")                      # headers never end
            elif i % 3 == 2:
                s.sendall(b"POST /sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")  # body never ends
            s.settimeout(0.2)
            socks.append(s)
        served_meanwhile = httpx.post(stack.url + "/sessions").status_code
        deadline = time.monotonic() + 15
        closed = set()
        while len(closed) < len(socks) and time.monotonic() < deadline:
            for i, s in enumerate(socks):
                if i in closed:
                    continue
                try:
                    if s.recv(4096) == b"":
                        closed.add(i)
                except socket.timeout:
                    pass
                except OSError:
                    closed.add(i)
        detail = {"slow_connections": len(socks), "closed_by_server": len(closed),
                  "served_meanwhile": served_meanwhile, "header_timeout_s": 1.0, "body_timeout_s": 1.0}
        return len(closed) == len(socks) and served_meanwhile == 200, detail
    finally:
        for s in socks:
            s.close()
        stack.stop()
        engine.stop()


@case("access_tokens")
def access_tokens(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    engine = start_engine(mean_response_tokens=8)
    stack = start_proxy(engine.url, access=AccessConfig(api_token="agent-token-0123", admin_token="admin-token-4567"))
    agent, admin = {"authorization": "Bearer agent-token-0123"}, {"authorization": "Bearer admin-token-4567"}
    try:
        u = stack.url
        sid = httpx.post(u + "/sessions", headers=agent).json()["session_id"]
        chat = httpx.post(f"{u}/sessions/{sid}/v1/chat/completions", json=MSG, headers=agent, timeout=30).status_code
        fin = httpx.post(f"{u}/sessions/{sid}/finalize", json={"reward": 1}, headers=agent).status_code
        agent_admin = {p: httpx.post(u + p, json={}, headers=agent).status_code
                       for p in ("/trajectory/read", "/v1/rollout/pause", "/v1/rollout/resume")}
        agent_admin["/v1/engines"] = httpx.get(u + "/v1/engines", headers=agent).status_code
        anonymous = httpx.post(u + "/sessions").status_code
        drained = httpx.post(u + "/trajectory/read", json={"drain": True}, headers=admin).json()
        try:
            ProxyConfig(server=ServerConfig(host="0.0.0.0"))
            refused_open_bind = False
        except ConfigError:
            refused_open_bind = True
        detail = {"agent_chat": chat, "agent_finalize": fin, "agent_on_admin_endpoints": agent_admin,
                  "no_token": anonymous, "admin_drained": len(drained.get("trajectories", [])),
                  "non_loopback_without_token_refused": refused_open_bind}
        passed = (chat == 200 and fin == 200 and all(v == 403 for v in agent_admin.values()) and anonymous == 401
                  and detail["admin_drained"] == 1 and refused_open_bind)
        return passed, detail
    finally:
        stack.stop()
        engine.stop()


@case("session_caps")
def session_caps(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    engine = start_engine(mean_response_tokens=8)
    stack = start_proxy(engine.url, sessions=SessionsConfig(max_sessions=100, session_timeout_s=600,
                                                         max_cached_turns=50))
    keeper = stack.proxy.service.book.keeper
    try:
        u = stack.url
        statuses: dict[int, int] = {}
        with httpx.Client(timeout=30) as client:
            for i in range(300):                 # fuzz-like churn: sessions nobody finalizes
                r = client.post(u + "/sessions") if i % 2 else client.post(
                    u + "/v1/chat/completions", json=FAILS_IN_PREPARE, headers={"x-session-id": f"churn-{i}"})
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            held = len(stack.core.sessions)
            keeper.timeout_s = 1.0               # now let them all go idle past a short timeout
            for i in range(80):                  # turn ids: the cache keeps at most its capacity
                client.post(u + "/v1/chat/completions", json=MSG, headers={"x-session-id": "turns",
                                                                           "x-turn-id": f"t{i}"})
            turns = len(stack.proxy.service.turns)
            time.sleep(1.5)                      # past the session timeout: the next admit evicts
            after = client.post(u + "/sessions").status_code
        detail = {"statuses": {str(k): v for k, v in sorted(statuses.items())}, "sessions_held_at_cap": held,
                  "failed_first_calls_left_sessions": sum(1 for s in stack.core.sessions if s.startswith("churn-")),
                  "turns_cached": turns, "evicted": keeper.evicted,
                  "sessions_after_timeout": len(stack.core.sessions), "create_after_timeout": after}
        passed = (held == 100 and statuses.get(429, 0) == 100 and detail["failed_first_calls_left_sessions"] == 0
                  and turns <= 50 and after == 200 and detail["evicted"] >= 100 and len(stack.core.sessions) <= 2)
        return passed, detail
    finally:
        stack.stop()
        engine.stop()


@case("schema_fuzz")
def schema_fuzz(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    from dressage_bench.faults.schema_fuzz import available, fuzz_schema

    missing = available()
    if missing is not None:
        return False, {"error": missing}
    engine = start_engine(mean_response_tokens=8)
    stack = start_proxy(engine.url, timeout_s=20, server=ServerConfig(max_body_bytes=1 << 20))
    try:
        out = fuzz_schema(stack.url, cases=cfg.schema_cases, seed=cfg.seed)
        out["schemathesis_server_errors"] = out["server_errors"]
        return out["server_errors"] == 0 and out["transport_errors"] == 0 and out["healthy_after"], {"schema": out}
    finally:
        stack.stop()
        engine.stop()
