"""The Proxy behind the real ``sglang-router`` (PyPI; a Rust binary, no GPU) in front of built-in engines.

The router drops the R3 fields of every ``/generate`` it forwards; in ``discovery`` mode the Proxy
only asks it for its workers and calls them itself. Engines run as processes (``dressage engine
serve``) so that one can be killed mid-call; tests skip when the router is not installed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from dressage.errors import EngineMismatchError
from dressage.testing.stack import start_proxy

pytestmark = pytest.mark.slow

WAIT_S = 60.0  # a bound on each wait for a process or a state, not a speed requirement


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(what, check, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def _answers(url: str, path: str = "/health") -> bool:
    try:
        return httpx.get(url + path, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class EngineProc:
    """``dressage engine serve`` in its own process (killed with SIGKILL to play a dead worker)."""

    def __init__(self, *, token_delay_s: float = 0.0, mean_response_tokens: int = 16) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        self.proc = subprocess.Popen([sys.executable, "-m", "dressage", "engine", "serve", "--port", str(self.port),
                                      "--seed", "3", "--model.preset", "tiny-moe",
                                      "--mean-response-tokens", str(mean_response_tokens),
                                      "--token-delay", str(token_delay_s)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _until(f"the engine at {self.url}", lambda: self.proc.poll() is None and _answers(self.url))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


class Router:
    """The real sglang-router over ``workers`` (health checked every second, as docs/proxy.md advises)."""

    def __init__(self, workers: list[str], *, policy: str = "manual") -> None:
        if importlib.util.find_spec("sglang_router") is None:
            pytest.skip("sglang-router is not installed (pip install 'sglang-router==0.3.2')")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                                      "--port", str(self.port), "--worker-urls", *workers, "--policy", policy,
                                      "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                                      "--log-level", "error",
                                      # its metrics port defaults to 29000: two routers at once would collide
                                      "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port())],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.skip(f"sglang-router did not start here (exit status {self.proc.returncode})")
            if len(self.workers()) == len(workers):
                return
            time.sleep(0.1)
        self.stop()
        pytest.skip("sglang-router did not list its workers in time here")

    def workers(self) -> list[dict]:
        try:
            return httpx.get(self.url + "/workers", timeout=2).json().get("workers", [])
        except (httpx.HTTPError, ValueError):
            return []

    def remove(self, url: str) -> None:
        (w,) = [w for w in self.workers() if w["url"].rstrip("/") == url]
        assert httpx.delete(f"{self.url}/workers/{w['id']}", timeout=5).status_code in (200, 202, 204)
        _until(f"the router to drop {url}", lambda: url not in {w["url"].rstrip("/") for w in self.workers()})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@contextlib.contextmanager
def _cluster(*, token_delay_s: float = 0.0, mean_response_tokens: int = 16):
    engines = [EngineProc(token_delay_s=token_delay_s, mean_response_tokens=mean_response_tokens) for _ in range(2)]
    try:
        router = Router([e.url for e in engines])
        try:
            yield router, engines
        finally:
            router.stop()
    finally:
        for e in engines:
            e.kill()


@pytest.fixture
def cluster():
    """Two engines behind a real router."""
    with _cluster() as c:
        yield c


@pytest.fixture
def slow_cluster():
    """Two engines that take a while per token (long replies) behind a real router: calls to cut."""
    with _cluster(token_delay_s=0.02, mean_response_tokens=4000) as c:
        yield c


def _proxy(router_url: str, **kw):
    return start_proxy(router_url, router=True, health_check_interval_s=0.2, partial_rollout=True, **kw)


def _turns(url: str, sid: str, n: int, *, max_tokens: int = 6) -> list[dict]:
    msgs = [{"role": "user", "content": f"task {sid}"}]
    answers = []
    for _ in range(n):
        r = httpx.post(url + "/v1/chat/completions", headers={"X-Session-Id": sid}, timeout=WAIT_S,
                       json={"messages": msgs, "max_tokens": max_tokens, "temperature": 0})
        assert r.status_code == 200, r.text
        answers.append(r.json())
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "go on"}]
    return answers


def test_r3_through_the_router_equals_a_direct_engine_and_sessions_stick(cluster):
    router, engines = cluster
    with _proxy(router.url) as via, start_proxy(engines[0].url) as direct:
        assert sorted(via.service.engines.members) == sorted(e.url for e in engines)
        for i in range(6):
            _turns(via.url, f"s{i}", 3)
        _turns(direct.url, "s0", 3)
        a, b = via.steps("s0"), direct.steps("s0")
        assert len(a) == len(b) == 3
        for x, y in zip(a.values(), b.values()):
            np.testing.assert_array_equal(x.response_ids, y.response_ids)
            assert x.routed_experts is not None and len(x.routed_experts) > 0
            np.testing.assert_array_equal(x.routed_experts, y.routed_experts)
        where = {f"s{i}": {st.metadata["engine"] for st in via.steps(f"s{i}").values()} for i in range(6)}
        assert all(len(urls) == 1 for urls in where.values())  # every session on one worker
        assert set().union(*where.values()) == {e.url for e in engines}  # and both workers used


def _start_calls(url: str, sids: list[str], max_tokens: int) -> tuple[list[threading.Thread], dict]:
    results: dict[str, httpx.Response] = {}

    def call(sid: str) -> None:
        results[sid] = httpx.post(url + "/v1/chat/completions", headers={"X-Session-Id": sid}, timeout=WAIT_S,
                                  json={"messages": [{"role": "user", "content": f"long {sid}"}],
                                        "max_tokens": max_tokens, "temperature": 0})

    threads = [threading.Thread(target=call, args=(sid,)) for sid in sids]
    for t in threads:
        t.start()
    return threads, results


def test_pause_aborts_calls_on_every_worker_including_one_removed_mid_call(slow_cluster):
    router, engines = slow_cluster
    with _proxy(router.url) as p:
        pool = p.service.engines
        threads, results = _start_calls(p.url, [f"p{i}" for i in range(4)], max_tokens=300)
        _until("a call running on each worker",
               lambda: all(m.in_flight for m in pool.members.values()) and len(pool.members) == 2)
        router.remove(engines[1].url)
        _until("the Proxy to see the worker removed", lambda: not pool.members[engines[1].url].listed)
        assert pool.members[engines[1].url].in_flight  # its call still runs there
        out = httpx.post(p.url + "/v1/rollout/pause", timeout=WAIT_S).json()
        assert out["aborted"] == 4 and out["still_running"] == 0
        httpx.post(p.url + "/v1/rollout/resume", json={"weight_version": 1}, timeout=WAIT_S)
        for t in threads:
            t.join(WAIT_S)
        assert {sid: r.status_code for sid, r in results.items()} == {f"p{i}": 200 for i in range(4)}
        for i in range(4):
            (step,) = p.steps(f"p{i}").values()
            assert step.metadata["engine_requests"] == 2  # cut by the pause, resumed on the same worker
            # The whole budget, unless the engine drew its end-of-turn token first (a 4000-token mean).
            finish = results[f"p{i}"].json()["choices"][0]["finish_reason"]
            assert len(step.response_ids) == 300 if finish == "length" else finish == "stop"


def test_resume_updating_engines_sets_live_workers_and_reports_a_dead_one(cluster):
    router, engines = cluster
    with _proxy(router.url) as p:
        httpx.post(p.url + "/v1/rollout/pause", timeout=WAIT_S)
        engines[1].kill()  # the router still lists it healthy for a while
        r = httpx.post(p.url + "/v1/rollout/resume", json={"version": "step-2", "update_engines": True},
                       timeout=WAIT_S)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["engines_updated"] == [engines[0].url] and list(out["engines_unreachable"]) == [engines[1].url]
        assert httpx.get(engines[0].url + "/get_weight_version").json()["weight_version"] == "step-2"
        listed = {e["url"]: e for e in httpx.get(p.url + "/v1/engines", timeout=WAIT_S).json()["engines"]}
        assert listed[engines[1].url]["healthy"] is False and listed[engines[1].url]["version_behind"] == "step-2"
        assert listed[engines[0].url]["weight_version"] == "step-2"
        for i in range(4):  # every session now goes to the live worker
            _turns(p.url, f"after{i}", 1)
            assert {st.metadata["engine"] for st in p.steps(f"after{i}").values()} == {engines[0].url}


def test_a_worker_killed_mid_call_is_a_502_and_the_session_fails_over(slow_cluster):
    router, engines = slow_cluster
    with _proxy(router.url) as p:
        pool = p.service.engines
        msgs = [{"role": "user", "content": "task k"}]
        r = httpx.post(p.url + "/v1/chat/completions", headers={"X-Session-Id": "k"}, timeout=WAIT_S,
                       json={"messages": msgs, "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "go on"}]
        first = pool.engine_of("k")
        victim = next(e for e in engines if e.url == first)
        result: dict = {}
        body = {"messages": msgs, "max_tokens": 300, "temperature": 0}

        def call() -> None:
            result["r"] = httpx.post(p.url + "/v1/chat/completions", headers={"X-Session-Id": "k"}, json=body,
                                     timeout=WAIT_S)

        t = threading.Thread(target=call)
        t.start()
        _until("the call to run", lambda: pool.members[first].in_flight)
        victim.kill()
        t.join(WAIT_S)
        assert result["r"].status_code == 502 and result["r"].json()["error"]["type"] == "engine_error"
        assert len(p.steps("k")) == 1  # nothing recorded
        body["max_tokens"] = 4
        r = httpx.post(p.url + "/v1/chat/completions", headers={"X-Session-Id": "k"}, json=body, timeout=WAIT_S)
        assert r.status_code == 200, r.text
        steps = list(p.steps("k").values())
        assert len(steps) == 2 and steps[1].metadata["engine"] != first
        assert steps[1].boundary is not None and steps[1].boundary.reason == "engine_failover"


def test_a_data_path_router_with_r3_on_is_refused_at_start_naming_the_cause(cluster):
    router, _ = cluster
    with pytest.raises(EngineMismatchError, match="dropped return_routed_experts.*--router-mode discovery"):
        start_proxy(router.url, router=True, router_mode="data_path")
    with start_proxy(router.url, router=True, router_mode="data_path", r3=False) as p:  # R3 off: it serves
        _turns(p.url, "d", 2)
        assert {st.metadata["engine"] for st in p.steps("d").values()} == {router.url}
