"""Weight versions, resume and scoped pause over HTTP: the engine + Proxy test stack."""

import asyncio

import httpx
import pytest

from dressage.fields import NAMED_BASE
from dressage.proxy.config import JournalConfig
from dressage.testing.stack import start_engine, start_proxy
from dressage.trajectory.sample import samples_of_session

PROMPT = [5, 6, 7, 8]


@pytest.fixture()
def engine():
    """A fresh engine for each test (not the module's shared one): the tests change its weight version."""
    srv = start_engine(seed=5, mean_response_tokens=8, tool_call_rate=0.0)
    yield srv
    srv.stop()


def _session(h, url, **metadata):
    return h.post(url + "/sessions", json={"metadata": metadata}).json()["session_id"]


def _generate(h, url, sid):
    r = h.post(f"{url}/sessions/{sid}/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4}})
    assert r.status_code == 200, r.text
    return r.json()


def _versions_of(proxy, sid):
    return [int(v) for st in proxy.core.session(sid).steps.values() for v in st.token_versions]


def _last_step_versions(proxy, sid):
    return set(int(v) for v in list(proxy.core.session(sid).steps.values())[-1].token_versions)


def _set_engine_version(h, engine, version):
    assert h.post(engine.url + "/update_weight_version", json={"new_version": version}).status_code == 200


def test_engine_versions_stamp_tokens_and_resume_is_the_fallback(engine):
    with start_proxy(engine.url, partial_rollout=True) as proxy, httpx.Client(timeout=20) as h:
        url = proxy.url
        sid = _session(h, url)
        _generate(h, url, sid)                   # the engine reports SGLang's unset "default"
        assert set(_versions_of(proxy, sid)) == {0}
        out = h.post(url + "/v1/rollout/resume", json={"weight_version": 3}).json()
        assert out["weight_version"] == 3 and out["version"] == "3"
        _generate(h, url, sid)
        assert _last_step_versions(proxy, sid) == {3}
        _set_engine_version(h, engine, "rl-step-7")  # now the engine names its weights
        _generate(h, url, sid)
        step7 = _versions_of(proxy, sid)[-1]
        assert step7 >= NAMED_BASE and _last_step_versions(proxy, sid) == {step7}
        state = h.get(url + "/v1/rollout/pause_state").json()
        assert state["version"] == "rl-step-7" and state["weight_version"] == step7 and state["from_engine"] == 1
        # The trainer's string version on resume; a later engine name orders after it.
        out = h.post(url + "/v1/rollout/resume", json={"version": "rl-step-6b"}).json()
        assert out["version"] == "rl-step-6b" and out["weight_version"] == step7 + 1
        # The trajectory's Samples name each version as the engine sent it, in order of first use.
        h.post(f"{url}/sessions/{sid}/finalize", json={"reward": 1.0})
        read = h.post(url + "/trajectory/read", json={"session_id": sid, "format": "samples"}).json()
        meta = read["data"][0]["samples"][0]["metadata"]
        assert meta["weight_version_labels"] == {str(step7): "rl-step-7"}
        done = proxy.service.trajectories.finalized[sid]
        samples = samples_of_session(done.segments, reward=done.reward, metadata=done.metadata)
        assert [v for s in samples for v in s.weight_versions] == ["0", "3", "rl-step-7"]


def test_resume_bodies_are_strict(engine):
    with start_proxy(engine.url, partial_rollout=True) as proxy, httpx.Client(timeout=20) as h:
        url = proxy.url
        bad = h.post(url + "/v1/rollout/resume", json={"new_version": "x"})
        assert bad.status_code == 400 and "new_version" in bad.json()["error"]["message"]
        assert h.post(url + "/v1/rollout/pause", json={"sesion_id": "a"}).status_code == 400
        clash = h.post(url + "/v1/rollout/resume", json={"weight_version": 2, "version": "3"})
        assert clash.status_code == 400 and "disagree" in clash.json()["error"]["message"]
        for body in ({"version": ""}, {"version": -1}, {"version": True}, {"version": 2.5}, {"weight_version": True},
                     {"weight_version": "2"}, {"weight_version": -1}):
            assert h.post(url + "/v1/rollout/resume", json=body).status_code == 422, body
        assert h.get(url + "/v1/rollout/pause_state").json()["weight_version"] == 0  # nothing changed
        both = h.post(url + "/v1/rollout/resume", json={"weight_version": 2, "version": "2"}).json()
        assert both["weight_version"] == 2 and both["resumed"] is False


def test_a_paused_session_or_instance_waits_while_others_run(engine):
    async def scenario(url):
        async with httpx.AsyncClient(timeout=20) as h:
            async def session(**meta):
                return (await h.post(url + "/sessions", json={"metadata": meta})).json()["session_id"]

            async def generate(sid):
                r = await h.post(f"{url}/sessions/{sid}/generate", json={"input_ids": PROMPT})
                assert r.status_code == 200, r.text
                return r.json()

            a, b, c = await session(instance_id="g1"), await session(instance_id="g2"), await session(instance_id="g1")
            out = (await h.post(url + "/v1/rollout/pause", json={"session_id": a, "reason": "sync"})).json()
            assert out["scope"] == {"session_id": a, "instance_id": None} and out["reason"] == "sync"
            held = asyncio.ensure_future(generate(a))
            await generate(b)                   # another session runs
            await generate(c)                   # so does a's instance mate: only the session is paused
            await asyncio.sleep(0.2)
            assert not held.done()
            await h.post(url + "/v1/rollout/pause", json={"instance_id": "g1"})
            held_c = asyncio.ensure_future(generate(c))
            await generate(b)
            state = (await h.get(url + "/v1/rollout/pause_state")).json()
            assert state["paused"] is False and state["paused_scopes"] == ["instance:g1", f"session:{a}"]
            await asyncio.sleep(0.2)
            assert not held.done() and not held_c.done()
            resumed = (await h.post(url + "/v1/rollout/resume", json={"reason": "weights synced"})).json()
            assert resumed["resumed"] is True and resumed["reason"] == "weights synced"
            await asyncio.wait_for(asyncio.gather(held, held_c), 20)
            return a, b, c

    with start_proxy(engine.url, partial_rollout=True) as proxy:
        a, b, c = asyncio.run(scenario(proxy.url))
        steps = {sid: len(proxy.core.session(sid).steps) for sid in (a, b, c)}
        assert steps == {a: 1, b: 2, c: 2}


def test_named_versions_keep_their_codes_across_a_journal_restart(engine, tmp_path):
    journal = str(tmp_path / "proxy.journal")
    with httpx.Client(timeout=20) as h:
        _set_engine_version(h, engine, "rl-step-7")
        with start_proxy(engine.url, journal=JournalConfig(path=journal, fsync="never")) as proxy:
            sid = _session(h, proxy.url)
            _generate(h, proxy.url, sid)
            step7 = _versions_of(proxy, sid)[0]
        _set_engine_version(h, engine, "rl-step-8")
        with start_proxy(engine.url, journal=JournalConfig(path=journal, fsync="never")) as proxy:
            versions = proxy.service.versions
            assert versions.table.label(step7) == "rl-step-7" and versions.current == step7
            # The recovered session still keeps its version: the engine moved on, so its call is refused.
            r = h.post(f"{proxy.url}/sessions/{sid}/generate", json={"input_ids": PROMPT})
            message = r.json()["error"]["message"]
            assert r.status_code == 502 and "rl-step-7" in message and "rl-step-8" in message, message
            assert len(proxy.core.session(sid).steps) == 1
            other = _session(h, proxy.url)
            _generate(h, proxy.url, other)
            step8 = _versions_of(proxy, other)[0]
            assert step8 == step7 + 1 and versions.table.label(step8) == "rl-step-8"


@pytest.fixture()
def slow_engine():
    # 20 ms per token: a 250-token reply is in flight for seconds, so a pause finds it running.
    srv = start_engine(seed=5, mean_response_tokens=2000, token_delay_s=0.02, tool_call_rate=0.0)
    yield srv
    srv.stop()


@pytest.mark.parametrize("end", ["abort", "discard", "finalize"])
def test_a_call_a_pause_holds_fails_as_soon_as_its_session_ends(slow_engine, end):
    async def scenario(url):
        async with httpx.AsyncClient(timeout=60) as h:
            sid = (await h.post(url + "/sessions", json={})).json()["session_id"]
            first = await h.post(f"{url}/sessions/{sid}/generate",
                                 json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}})
            assert first.status_code == 200
            assert (await h.post(url + "/v1/rollout/pause", json={})).status_code == 200
            held = asyncio.ensure_future(h.post(f"{url}/sessions/{sid}/generate",
                                                json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 5}}))
            await asyncio.sleep(0.3)
            assert not held.done()              # the pause holds it
            path, body = {"abort": (f"/sessions/{sid}/abort", None), "discard": ("/session/discard", {"session_id": sid}),
                          "finalize": (f"/sessions/{sid}/finalize", {"wait_s": 0.2})}[end]
            assert (await h.post(url + path, json=body)).status_code == 200
            out = await asyncio.wait_for(held, 30)  # answered before the resume below
            await h.post(url + "/v1/rollout/resume", json={})
            return out

    with start_proxy(slow_engine.url, partial_rollout=True) as proxy:
        out = asyncio.run(scenario(proxy.url))
        assert out.status_code == 409 and out.json()["error"]["code"] == "session_state", out.text


@pytest.mark.parametrize("partial_rollout", [True, False], ids=["partial", "no_partial"])
def test_a_session_pause_cuts_only_that_sessions_call_in_flight(slow_engine, partial_rollout):
    async def scenario(url):
        async with httpx.AsyncClient(timeout=60) as h:
            async def session():
                return (await h.post(url + "/sessions", json={})).json()["session_id"]

            async def generate(sid, n):
                return await h.post(f"{url}/sessions/{sid}/generate",
                                    json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": n}})

            a, b = await session(), await session()
            call_a = asyncio.ensure_future(generate(a, 250))
            while (await h.get(url + "/v1/rollout/pause_state")).json()["in_flight"] < 1:
                await asyncio.sleep(0.01)
            call_b = asyncio.ensure_future(generate(b, 20))
            paused = (await h.post(url + "/v1/rollout/pause", json={"session_id": a})).json()
            assert paused["aborted"] == 1 and paused["still_running"] == 0
            out_b = await call_b                # b is not cut: it finishes while a is held
            assert out_b.status_code == 200
            if partial_rollout:
                assert not call_a.done()        # a's call waits for resume
            await h.post(url + "/v1/rollout/resume", json={"version": "rl-1"})
            return a, b, await call_a

    with start_proxy(slow_engine.url, partial_rollout=partial_rollout) as proxy:
        a, b, out_a = asyncio.run(scenario(proxy.url))
        (step_b,) = proxy.core.session(b).steps.values()
        assert step_b.metadata["engine_requests"] == 1
        if partial_rollout:
            (step_a,) = proxy.core.session(a).steps.values()
            assert out_a.status_code == 200 and step_a.metadata["engine_requests"] == 2
            assert 0 < len(step_a.response_ids) <= 250  # one response from the cut and its resumption
            # The engine reports no version of its own: tokens kept from before the cut carry 0 (none
            # when the abort came before the first token), those after it the version resume set.
            rl1 = proxy.service.versions.table.code("rl-1")
            versions = [int(v) for v in step_a.token_versions]
            assert versions[-1] == rl1 and versions == sorted(versions) and set(versions) <= {0, rl1}
        else:
            assert out_a.status_code == 502 and out_a.json()["error"]["code"] == "generation_preempted"
            assert out_a.json()["detail"]["error"] == "generation_preempted"
            assert not proxy.core.session(a).steps     # nothing recorded for the cut call
