"""The agents' driver against the real Proxy server and engine over loopback (official openai client)."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx

from dressage.agents import AgentConfig, make_prompts, run_rollout

TOKEN = "agents-test-token"
N_PROMPTS, N_SAMPLES = 3, 2
# Byte tokenizer: ~1.4K tokens of system + tools + task; a 2.4K budget compresses every few turns.
CONFIG = AgentConfig(max_turns=12, retry_rate=0.25, context_length=2400, compression_threshold=0.8,
                     max_tokens=160, temperature=0.8, seed=5, request_timeout_s=30)


def _model():
    from dressage.fields import get_model

    return get_model("tiny-moe")


class _Proxy:
    """A Proxy on a free port in this process (``Proxy.start``), recording R3, with the given engine URL and token."""

    def __init__(self, engine_url: str, token: str | None = TOKEN, *, check_engine: bool = True) -> None:
        from dressage.dataplane import DataPlaneConfig
        from dressage.proxy import Proxy
        from dressage.proxy.config import AccessConfig, EnginesConfig, ProxyConfig

        self.proxy = Proxy.start(ProxyConfig(
            data_plane=DataPlaneConfig(model=_model(), use_rollout_routing_replay=True),
            engines=EnginesConfig(engine_urls=(engine_url,), request_timeout_s=20, skip_engine_check=not check_engine),
            access=AccessConfig(api_token=token)))
        self.service, self.url, self.token = self.proxy.service, self.proxy.url, token

    def segments(self, session_id: str) -> list[dict]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        r = httpx.get(f"{self.url}/sessions/{session_id}/segments", headers=headers, timeout=10)
        r.raise_for_status()
        return r.json()

    def close(self) -> None:
        self.proxy.shutdown()


def _rollout(proxy: _Proxy, *, concurrency: int, token: str | None = TOKEN, config: AgentConfig = CONFIG):
    prompts = make_prompts(N_PROMPTS, seed=2, max_background_words=0)
    return asyncio.run(run_rollout(proxy.url, prompts, N_SAMPLES, config, concurrency=concurrency, token=token,
                                   metadata={"rollout_id": 7}))


def _fingerprint(proxy: _Proxy, report) -> list:
    """What must replay for a seed: per session counters, reward and every Segment's tokens."""
    out = []
    for r in report.results:
        segs = proxy.segments(r.session_id)
        out.append((r.group_index, r.sample_index, r.turns, r.tool_calls, r.retries, r.compressions, r.reward,
                    r.end_reason, [(s["boundary_reason"], s["response_length"], s["tokens"]) for s in segs]))
    return out


def test_rollout_runs_tools_retries_and_compressions_through_the_real_proxy(engine):
    proxy = _Proxy(engine.url)
    try:
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
            done = proxy.service.finalized[r.session_id]
            assert done.reward == r.reward and 0.0 <= r.reward <= 1.0
            assert done.metadata["group_index"] == r.group_index
            assert done.metadata["sample_index"] == r.sample_index
            assert done.metadata["rollout_id"] == 7 and done.metadata["n_samples_per_prompt"] == N_SAMPLES
            segs = proxy.segments(r.session_id)
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
    finally:
        proxy.close()


def test_same_seed_replays_the_same_sessions_whatever_the_concurrency(engine):
    first, second = _Proxy(engine.url), _Proxy(engine.url)
    try:
        a = _fingerprint(first, _rollout(first, concurrency=6))
        b = _fingerprint(second, _rollout(second, concurrency=1))
        assert a == b
    finally:
        first.close()
        second.close()


def test_wrong_token_fails_every_session_without_crashing_the_rollout(engine):
    proxy = _Proxy(engine.url)
    try:
        report = _rollout(proxy, concurrency=3, token="wrong")
        assert report.sessions == N_PROMPTS * N_SAMPLES
        assert report.errors_by_kind == {"status_401": report.sessions}
        assert all(r.status == "failed" and r.session_id is None for r in report.results)
        assert "bearer token" in report.results[0].error
    finally:
        proxy.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_engine_down_aborts_each_session_and_counts_the_upstream_error():
    proxy = _Proxy(f"http://127.0.0.1:{_free_port()}", check_engine=False)  # started before the engine is up
    try:
        report = _rollout(proxy, concurrency=3)
        assert report.errors == report.sessions == N_PROMPTS * N_SAMPLES
        assert set(report.errors_by_kind) <= {"status_502", "status_503", "status_504"}
        for r in report.results:
            assert r.status == "aborted" and r.turns == 0 and r.end_reason == "error"
            assert proxy.service.core.state_of(r.session_id) == "aborted" and r.session_id not in proxy.service.core.sessions
        info = httpx.get(f"{proxy.url}/health", timeout=5).json()
        assert json.dumps(info)  # the Proxy is still serving
    finally:
        proxy.close()
