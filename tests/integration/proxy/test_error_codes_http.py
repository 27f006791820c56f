"""The Proxy answers errors with their snake_case codes over HTTP, never a Python class name."""

import httpx


def test_an_unknown_session_answers_404_unknown_session(engine, proxy_stack):
    proxy = proxy_stack(engine.url)
    r = httpx.post(f"{proxy.url}/sessions/never-created/v1/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=20)
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert error["code"] == "unknown_session" and "never-created" in error["message"]
