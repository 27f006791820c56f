"""Hostile HTTP input against every Proxy endpoint: zero 5xx caused by input, healthy afterwards.

The request mix is drawn from a seeded RNG over the app's own OpenAPI paths: random JSON of
every type, mutated valid bodies, invalid UTF-8, truncated JSON, bodies over the size limit,
unknown and malformed session ids, and replayed finalize calls.
"""

from __future__ import annotations

import json
import random
from typing import Any

import httpx

from dressage.proxy.config import ServerConfig
from dressage_bench.faults._stack import start_engine, start_proxy
from dressage_bench.faults.runner import FaultsConfig, case

_WEIRD_STRINGS = ["", "\x00", "\u202e", "😀" * 50, "a" * 5000, "<|im_end|>", "<tool_call>{",
                  "../../etc/passwd", "%00", "null", "{}", "' OR 1=1 --"]


def _rand_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2**31, 2**63, -(2**70), 2**53 + 1])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1e308, -1e-308, 3.5, 1e16])
    if kind in (4, 5):
        return rng.choice(_WEIRD_STRINGS)
    if kind in (6, 7):
        return {rng.choice(["messages", "role", "content", "reward", "metadata", "input_ids", "max_tokens",
                            "tools", "x", ""]): _rand_json(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [_rand_json(rng, depth + 1) for _ in range(rng.randrange(4))]


def _mutated_chat(rng: random.Random) -> Any:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    field = rng.choice(["messages", "max_tokens", "temperature", "tools", "stop", "n", "top_p", "seed", "stream"])
    body[field] = _rand_json(rng)
    if rng.random() < 0.3:
        body["messages"] = [{"role": rng.choice(["user", "assistant", "tool", "system", "robot"]),
                             "content": _rand_json(rng), "tool_calls": _rand_json(rng)}]
    return body


def _request(rng: random.Random, paths: list[tuple[str, str]], sid: str, limit: int) -> tuple[str, str, dict]:
    method, path = rng.choice(paths)
    session = rng.choice([sid, sid, "unknown-" + str(rng.randrange(10**6)), "%2e%2e", "a" * 300, "x y"])
    path = path.replace("{session_id}", session)
    r = rng.random()
    kw: dict[str, Any] = {"headers": {"content-type": "application/json"}}
    if r < 0.35:
        kw["content"] = json.dumps(_rand_json(rng)).encode()
    elif r < 0.6 and "chat" in path:
        kw["content"] = json.dumps(_mutated_chat(rng)).encode()
    elif r < 0.7:
        kw["content"] = b'{"messages": [{"role": "user", "content": "\xff\xfe broken utf-8"}]}'
    elif r < 0.8:
        kw["content"] = b'{"messages": [{"role": "user"'  # truncated
    elif r < 0.85:
        kw["content"] = b"[" * (limit + 10)  # over the body limit
    elif r < 0.9:
        kw["content"] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    else:
        kw = {}
    return method, path, kw


@case("http_fuzz")
def http_fuzz(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    rng = random.Random(cfg.seed)
    engine = start_engine(mean_response_tokens=8)
    limit = 1 << 20
    stack = start_proxy(engine.url, timeout_s=20, server=ServerConfig(max_body_bytes=limit))
    try:
        app_paths = httpx.get(stack.url + "/openapi.json").json()["paths"]
        # A well-formed pause legitimately stops every generation until resume: not a fuzz target.
        paths = [(m.upper(), p) for p, ops in app_paths.items() for m in ops
                 if m in ("get", "post") and not p.endswith("/rollout/pause")]
        statuses: dict[int, int] = {}
        server_errors: list[str] = []
        with httpx.Client(timeout=30) as client:
            sid = client.post(stack.url + "/sessions").json()["session_id"]
            for i in range(cfg.fuzz_inputs):
                method, path, kw = _request(rng, paths, sid, limit)
                try:
                    resp = client.request(method, stack.url + path, **kw)
                except httpx.HTTPError as exc:
                    server_errors.append(f"{method} {path}: transport error {exc}")
                    continue
                statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
                if resp.status_code >= 500:
                    server_errors.append(f"{method} {path}: {resp.status_code} {resp.text[:200]}")
                if i % 50 == 49:  # replayed finalize on a fresh session
                    sid2 = client.post(stack.url + "/sessions").json()["session_id"]
                    for _ in range(2):
                        r = client.post(f"{stack.url}/sessions/{sid2}/finalize", json={"reward": 1})
                        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            health = client.get(stack.url + "/health").status_code
            sid3 = client.post(stack.url + "/sessions").json()["session_id"]
            ok = client.post(f"{stack.url}/sessions/{sid3}/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "still there?"}], "max_tokens": 8})
        detail = {"fuzz": {"inputs": cfg.fuzz_inputs, "server_errors": len(server_errors)},
                  "statuses": {str(k): v for k, v in sorted(statuses.items())},
                  "examples_of_5xx": server_errors[:5], "healthy_after": health == 200,
                  "valid_call_after": ok.status_code}
        return not server_errors and health == 200 and ok.status_code == 200, detail
    finally:
        stack.stop()
        engine.stop()
