"""Sessions of a prompt group through a real Proxy over HTTP, for the trajectory-read tests."""

from __future__ import annotations

import httpx


def record_session(url: str, sid: str, instance: str, *, finalize: bool = True) -> None:
    """One recorded call in session ``sid`` of prompt group ``instance``, then (``finalize``) its finalize."""
    r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": f"hi {sid}"}],
                                                       "max_tokens": 6},
                   headers={"X-Session-Id": sid, "X-Instance-Id": instance}, timeout=30)
    assert r.status_code == 200, r.text
    if finalize:
        finalize_session(url, sid, instance)


def finalize_session(url: str, sid: str, instance: str) -> None:
    r = httpx.post(url + "/session/finalize", json={"session_id": sid, "instance_id": instance, "reward": 1.0},
                   timeout=30)
    assert r.status_code == 200, r.text


def read_trajectories(url: str, **body) -> dict:
    """``POST /trajectory/read`` with ``body``; its answer (must be a 200)."""
    r = httpx.post(url + "/trajectory/read", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()
