"""Schemathesis over the Proxy's own OpenAPI schema as a fuzz source (case ``schema_fuzz``).

Every operation of ``/openapi.json`` gets its share of ``cases`` requests generated from its
schema (valid and invalid bodies, paths, queries); each answer goes through schemathesis' built-in
checks (all that are enabled by default: server errors, status codes and content types the
schema does not document, response schema conformance, ...). The case passes when no answer is a
5xx and the Proxy is healthy afterwards; the other check failures are reported by check name. A
``POST /v1/rollout/pause`` is followed by a resume, so that one fuzzed pause does not hold every
later generation.
"""

from __future__ import annotations

import collections
import random
from typing import Any

__all__ = ["fuzz_schema", "available"]


def available() -> str | None:
    """``None`` when schemathesis can be imported, else why not."""
    try:
        import schemathesis  # noqa: F401
    except ImportError as exc:
        return f"schemathesis is not installed ({exc}); pip install 'dressage-bench[fuzz]'"
    return None


def _check_names(exc: BaseException) -> list[str]:
    found = []
    for e in getattr(exc, "exceptions", None) or [exc]:
        title = getattr(e, "title", None) or type(e).__name__
        found.append(str(title))
    return found


def fuzz_schema(base_url: str, *, cases: int, seed: int = 0, headers: dict[str, str] | None = None,
                timeout_s: float = 30.0) -> dict[str, Any]:
    """Run about ``cases`` schemathesis cases against a running Proxy; returns the figures."""
    import requests
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    schema = schemathesis.openapi.from_url(base_url + "/openapi.json", headers=dict(headers or {}))
    ops = [result.ok() for result in schema.get_all_operations()]
    statuses: collections.Counter = collections.Counter()
    failures: collections.Counter = collections.Counter()
    server_errors: list[str] = []
    transport_errors: list[str] = []
    sent = 0
    session = requests.Session()
    if headers:
        session.headers.update(headers)
    rng = random.Random(seed)

    def live_session() -> str:
        # Half the cases name a real session (with one recorded turn), so that the routes behind
        # the session lookup are reached too, not only their 404.
        sid = session.post(base_url + "/sessions", json={}, timeout=timeout_s).json()["session_id"]
        session.post(f"{base_url}/sessions/{sid}/v1/chat/completions", timeout=timeout_s,
                     json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        return sid

    def one_round(round_no: int, per_op: int) -> None:
        for op in ops:
            @hseed(seed * 1000 + round_no)
            @settings(max_examples=per_op, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
            @given(case=op.as_strategy())
            def run(case: Any) -> None:
                nonlocal sent
                if "session_id" in (case.path_parameters or {}) and rng.random() < 0.5:
                    case.path_parameters["session_id"] = live_session()
                try:
                    response = case.call(base_url=base_url, session=session, timeout=timeout_s)
                except requests.RequestException as exc:
                    transport_errors.append(f"{op.method.upper()} {op.path}: {type(exc).__name__}: {exc}"[:300])
                    return
                sent += 1
                statuses[response.status_code] += 1
                if response.status_code >= 500:
                    server_errors.append(f"{op.method.upper()} {case.formatted_path}: {response.status_code} "
                                         f"{response.text[:200]}")
                try:
                    case.validate_response(response)
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as exc:  # schemathesis' check failures (a group, not an Exception)
                    for name in _check_names(exc):
                        failures[name] += 1
                if op.path.endswith("/rollout/pause") and response.status_code < 300:
                    session.post(base_url + "/v1/rollout/resume", json={}, timeout=timeout_s)

            run()

    # Operations with few inputs run out of distinct cases early: rounds with new seeds fill up.
    for round_no in range(50):
        if sent >= cases:
            break
        one_round(round_no, max(1, -(-(cases - sent) // max(1, len(ops)))))
    health = session.get(base_url + "/health", timeout=timeout_s).status_code
    return {"schemathesis_cases": sent, "operations": len(ops), "server_errors": len(server_errors),
            "transport_errors": len(transport_errors), "healthy_after": health == 200,
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "check_failures": dict(failures.most_common()), "examples_of_5xx": server_errors[:5],
            "examples_of_transport_errors": transport_errors[:3]}
