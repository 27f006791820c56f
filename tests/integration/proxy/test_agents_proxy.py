"""The agents' driver against the real Proxy server and engine over loopback (official openai client)."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx

from dressage.harness.agents import AgentConfig, make_prompts, run_rollout
from dressage.testing.stack import ProxyStack

TOKEN = "agents-test-token"
N_PROMPTS, N_SAMPLES = 3, 2
# Byte tokenizer: ~1.4K tokens of system + tools + task; a 2.4K budget compresses every few turns.
CONFIG = AgentConfig(max_turns=12, retry_rate=0.25, context_length=2400, compression_threshold=0.8,
                     max_tokens=160, temperature=0.8, seed=5, request_timeout_s=30)


def _segments(proxy: ProxyStack, session_id: str) -> list[dict]:
    r = httpx.get(f"{proxy.url}/sessions/{session_id}/segments", headers={"Authorization": f"Bearer {TOKEN}"},
                  timeout=10)
    r.raise_for_status()
    return r.json()


def _rollout(proxy: ProxyStack, *, concurrency: int, token: str | None = TOKEN, config: AgentConfig = CONFIG):
    prompts = make_prompts(N_PROMPTS, seed=2, max_background_words=0)
    return asyncio.run(run_rollout(proxy.url, prompts, N_SAMPLES, config, concurrency=concurrency, token=token,
                                   metadata={"rollout_id": 7}))


def _fingerprint(proxy: ProxyStack, report) -> list:
    """What must replay for a seed: per session counters, reward and every Segment's tokens."""
    out = []
    for r in report.results:
        segs = _segments(proxy, r.session_id)
        out.append((r.group_index, r.sample_index, r.turns, r.tool_calls, r.retries, r.compressions, r.reward,
                    r.end_reason, [(s["boundary_reason"], s["response_length"], s["tokens"]) for s in segs]))
    return out


def test_rollout_runs_tools_retries_and_compressions_through_the_real_proxy(engine, proxy_stack):
    proxy = proxy_stack(engine.url, api_token=TOKEN)
    report = _rollout(proxy, concurrency=4)
    assert report.sessions == N_PROMPTS * N_SAMPLES
    assert report.errors == 0, [r.error for r in report.results]
    assert report.finalized == report.sessions
    assert report.tool_calls > 0 and report.retries > 0 and report.compressions > 0
    assert len(set(report.session_ids)) == report.sessions
    assert [(r.group_index, r.sample_index) for r in report.results] == \
        [(g, i) for g in range(N_PROMPTS) for i in range(N_SAMPLES)]

    reasons, multi_segment = set(), 0
    for r in report.results:
        done = proxy.service.trajectories.finalized[r.session_id]
        assert done.reward == r.reward and 0.0 <= r.reward <= 1.0
        assert done.metadata["group_index"] == r.group_index
        assert done.metadata["sample_index"] == r.sample_index
        assert done.metadata["rollout_id"] == 7 and done.metadata["n_samples_per_prompt"] == N_SAMPLES
        segs = _segments(proxy, r.session_id)
        reasons.update(s["boundary_reason"] for s in segs)
        multi_segment += len(segs) > 1
        session = proxy.service.core.sessions[r.session_id]
        assert len(session.steps) == r.turns
        if r.compressions:
            assert any(st.boundary is not None and st.boundary.reason == "history_rewrite"
                       for st in session.steps.values())
        if r.retries:
            # A retried request re-sends a non-root turn: the Proxy records a branch off its parent.
            assert any(st.branch_from is not None for st in session.steps.values())
    assert "history_rewrite" in reasons
    assert multi_segment > 0


def test_same_seed_replays_the_same_sessions_whatever_the_concurrency(engine, proxy_stack):
    first, second = proxy_stack(engine.url, api_token=TOKEN), proxy_stack(engine.url, api_token=TOKEN)
    a = _fingerprint(first, _rollout(first, concurrency=6))
    b = _fingerprint(second, _rollout(second, concurrency=1))
    assert a == b


def test_wrong_token_fails_every_session_without_crashing_the_rollout(engine, proxy_stack):
    proxy = proxy_stack(engine.url, api_token=TOKEN)
    report = _rollout(proxy, concurrency=3, token="wrong")
    assert report.sessions == N_PROMPTS * N_SAMPLES
    assert report.errors_by_kind == {"status_401": report.sessions}
    assert all(r.status == "failed" and r.session_id is None for r in report.results)
    assert "bearer token" in report.results[0].error


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_engine_down_aborts_each_session_and_counts_the_upstream_error(proxy_stack):
    # started before the engine is up
    proxy = proxy_stack(f"http://127.0.0.1:{_free_port()}", api_token=TOKEN, check_engine=False)
    report = _rollout(proxy, concurrency=3)
    assert report.errors == report.sessions == N_PROMPTS * N_SAMPLES
    assert set(report.errors_by_kind) <= {"status_502", "status_503", "status_504"}
    for r in report.results:
        assert r.status == "aborted" and r.turns == 0 and r.end_reason == "error"
        assert proxy.service.core.state_of(r.session_id) == "aborted" and r.session_id not in proxy.service.core.sessions
    info = httpx.get(f"{proxy.url}/health", timeout=5).json()
    assert json.dumps(info)  # the Proxy is still serving
