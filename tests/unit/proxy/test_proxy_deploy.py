"""The Proxy over HTTP against SGLang's real wire shapes (sglang_mock) and upstream-shaped client calls.

SGLang side: queued aborts, ``meta_info.weight_version``, abort by rid prefix, a router's workers
and the engine API key. Client side: turn scopes, finalize twice and during an in-flight call,
discard, trajectory read by id and by ``max_groups``, capabilities, body session ids.
"""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import numpy as np
import pytest

from dressage.fields import get_model
from dressage.proxy.config import DataPlaneConfig, EnginesConfig, ProxyConfig, SessionsConfig
from dressage.proxy.deployment import build_service
from dressage.proxy.http.app import build_app
from dressage.proxy.engines.rids import RID_LENGTH
from dressage.errors import EngineMismatchError
from dressage.proxy.engines.startup import check_router_r3, engine_clients
from sglang_mock import MockSGLang, routing_row

MODEL = get_model("tiny-moe")
W1, W2, ROUTER = "http://10.0.0.1:30001", "http://10.0.0.2:30002", "http://router.test:30000"


def make(mock, *, r3=True, partial=True, router=False, tq=None, key=None, sink=None, router_mode="discovery"):
    """The Proxy service from the composition root (``build_service``), its engines on ``mock``'s
    transport, served in process over ASGI."""
    dp = DataPlaneConfig(model=MODEL, use_rollout_routing_replay=r3, enable_transfer_queue=tq is not None)
    engines = EnginesConfig(engine_url=mock.router or mock.workers[0], router=router, engine_api_key=key,
                            request_timeout_s=20, router_mode=router_mode)
    cfg = ProxyConfig(data_plane=dp, engines=engines, sessions=SessionsConfig(partial_rollout=partial))
    service, _ = build_service(cfg, tq_client=tq.client() if tq is not None else None,
                               engine=engine_clients(engines, transport=mock.transport()), sink=sink)
    return service, httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(service)), base_url="http://proxy")


def chat(h, sid, text, *, turn=None, instance=None, max_tokens=3, retry=None, **extra):
    headers = {"X-Session-Id": sid}
    if turn is not None:
        headers["X-Turn-Id"] = turn
    if instance is not None:
        headers["X-Instance-Id"] = instance
    if retry is not None:  # as the OpenAI SDK sends it: 0 on the first attempt
        headers["x-stainless-retry-count"] = str(retry)
    return h.post("/v1/chat/completions", headers=headers,
                  json={"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, **extra})


def steps(service, sid):
    s = service.core.sessions[sid]
    return [s.steps[k] for k in sorted(s.steps)]


def expected_rows(step):
    full = np.concatenate([step.prompt_ids, step.response_ids])
    return np.stack([routing_row(int(full[p]), p, MODEL.num_layers, MODEL.topk, MODEL.num_experts)
                     for p in range(step.routed_experts_start, len(full) - 1)])


# ----------------------------------------------------------------------------------- SGLang side

def test_a_call_aborted_while_queued_resumes_under_r3_and_takes_the_engine_version():
    async def go():
        mock = MockSGLang([W1])
        service, h = make(mock)
        mock.hold_all = True
        call = asyncio.ensure_future(chat(h, "s", "hello"))
        await mock.until_pending()
        paused = (await h.post("/v1/rollout/pause")).json()
        assert paused["aborted"] == 1 and paused["still_running"] == 0
        aborted = [r for r in mock.calls("/abort_request")]
        assert aborted and {r["body"]["rid"] for r in aborted} == {mock.calls("/generate")[0]["body"]["rid"]}
        mock.release()
        mock.versions[W1] = "5"  # the trainer pushed new weights
        await h.post("/v1/rollout/resume", json={"weight_version": 5})
        r = await call
        assert r.status_code == 200, r.text
        (step,) = steps(service, "s")
        gens = mock.calls("/generate")
        assert step.metadata["engine_requests"] == 2 and len(gens) == 2
        # The queued abort answered no ids and no routing: the resumed request starts where the call was.
        assert gens[1]["body"]["input_ids"] == gens[0]["body"]["input_ids"]
        assert gens[1]["body"]["routed_experts_start_len"] == gens[0]["body"]["routed_experts_start_len"] == 0
        assert step.token_versions.tolist() == [5, 5, 5]
        np.testing.assert_array_equal(np.asarray(step.routed_experts, dtype=np.int32), expected_rows(step))
        # The next answer says the engine is at "6": its tokens carry 6, whatever the Proxy's counter says.
        mock.versions[W1] = "6"
        assert (await chat(h, "t", "hi")).status_code == 200
        assert steps(service, "t")[0].token_versions.tolist() == [6, 6, 6]
        assert (await h.get("/health")).json()["weight_version"] == 6

    asyncio.run(go())


def test_a_pause_of_one_session_aborts_only_its_call_under_sglang_prefix_matching():
    async def go():
        mock = MockSGLang([W1])
        service, h = make(mock)
        for _ in range(11):  # enough calls that a counter-suffixed rid would be a prefix of a later one
            assert (await chat(h, "a", "warm up")).status_code == 200
        mock.hold_all = True
        calls = {sid: asyncio.ensure_future(chat(h, sid, "go")) for sid in ("a", "b")}
        await mock.until_pending(2)
        rids = {g["headers"]["x-smg-routing-key"]: g["body"]["rid"] for g in mock.calls("/generate")[-2:]}
        out = await service.pause.pause(session_id="a")
        assert out["aborted"] == 1
        assert [p.rid for p in mock.pending.values()] == [rids["b"]]  # b still runs on the engine
        every = [g["body"]["rid"] for g in mock.calls("/generate")]
        assert {len(r) for r in every} == {RID_LENGTH}
        assert not any(x != y and y.startswith(x) for x in every for y in every)
        mock.release()
        assert (await calls["b"]).status_code == 200
        service.resume_rollout(None)
        assert (await calls["a"]).status_code == 200
        assert steps(service, "a")[-1].metadata["engine_requests"] == 2
        assert steps(service, "b")[-1].metadata["engine_requests"] == 1

    asyncio.run(go())


def test_behind_a_data_path_router_generate_carries_the_routing_key_and_aborts_fan_out_to_workers():
    async def go():
        mock = MockSGLang([W1, W2], router=ROUTER, api_key="sk-engine")
        service, h = make(mock, r3=False, router=True, key="sk-engine", router_mode="data_path")
        assert service.router
        mock.hold_all = True
        call = asyncio.ensure_future(chat(h, "sess-42", "hello"))
        await mock.until_pending()
        await h.post("/v1/rollout/pause")
        mock.release()
        await h.post("/v1/rollout/resume", json={"weight_version": 1})
        assert (await call).status_code == 200
        gens = mock.calls("/generate", ROUTER)
        assert len(gens) == 2 and {g["headers"]["x-smg-routing-key"] for g in gens} == {"sess-42"}
        aborts = mock.calls("/abort_request")
        # Every listed HTTP worker got it (the unhealthy one too, not the gRPC one); the router was not needed.
        assert {r["origin"] for r in aborts} == {W1, W2, "http://10.0.0.3:1"}
        assert not mock.calls("/abort_request", ROUTER)
        assert all(r["body"] == {"rid": gens[0]["body"]["rid"], "abort_all": False} for r in aborts)
        assert all(r["headers"].get("authorization") == "Bearer sk-engine" for r in mock.requests)
        # Weight-version calls go to each worker too.
        await service.engine.update_weight_version("step-9")
        assert mock.versions == {W1: "step-9", W2: "step-9"} and await service.engine.get_weight_version() == "step-9"
        caps = (await h.get("/integration/capabilities")).json()["dressage"]
        assert caps["features"]["router_fanout"] is True and caps["engines"] == 1

    asyncio.run(go())


def test_a_data_path_router_that_drops_r3_is_refused_at_start_naming_the_mode():
    mock = MockSGLang([W1, W2], router=ROUTER)
    engines = EnginesConfig(router_url=ROUTER, router_mode="data_path")
    cfg = ProxyConfig(data_plane=DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True), engines=engines)
    with pytest.raises(EngineMismatchError, match="dropped return_routed_experts.*--router-mode discovery"):
        check_router_r3(cfg, transport=mock.transport())
    direct = EnginesConfig(engine_url=W1)  # a worker itself keeps the fields: nothing to refuse
    check_router_r3(dataclasses.replace(cfg, engines=direct), transport=mock.transport())
    check_router_r3(dataclasses.replace(cfg, engines=EnginesConfig(router_url=ROUTER)), transport=mock.transport())


def test_behind_a_discovery_router_r3_goes_to_the_workers_and_each_session_sticks_to_one():
    async def go():
        mock = MockSGLang([W1, W2], router=ROUTER, api_key="sk-engine")
        service, h = make(mock, router=True, key="sk-engine")
        assert service.router and sorted(service.engines.members) == [W1, W2, "http://10.0.0.3:1"]
        for turn in range(3):
            for i in range(8):
                r = await chat(h, f"sess-{i}", "hello " * (turn + 1))
                assert r.status_code == 200, r.text
        assert not mock.calls("/generate", ROUTER)  # the router only lists the workers
        gens = mock.calls("/generate")
        assert all(g["body"]["return_routed_experts"] is True for g in gens)
        by_session: dict[str, set] = {}
        for g in gens:
            by_session.setdefault(g["headers"]["x-smg-routing-key"], set()).add(g["origin"])
        assert len(by_session) == 8 and all(len(o) == 1 for o in by_session.values())
        assert set().union(*by_session.values()) == {W1, W2}  # both live workers take sessions
        for i in range(8):  # every step has its R3 rows (prompt + response - 1 of them)
            for st in service.core.session(f"sess-{i}").steps.values():
                assert st.routed_experts.shape[0] == st.seq_len - 1
        # A pause aborts the call on the worker it runs on.
        mock.hold_all = True
        call = asyncio.ensure_future(chat(h, "sess-0", "again"))
        await mock.until_pending()
        (running,) = {p.worker for p in mock.pending.values()}
        await h.post("/v1/rollout/pause")
        assert {r["origin"] for r in mock.calls("/abort_request")} >= {running}
        mock.release()
        await h.post("/v1/rollout/resume", json={"weight_version": 1})
        assert (await call).status_code == 200

    asyncio.run(go())


def test_a_pause_names_a_worker_its_abort_cannot_reach_instead_of_waiting_on_it():
    async def go():
        mock = MockSGLang([W1, W2], router=ROUTER)
        service, h = make(mock, router=True)
        mock.hold_all = True
        call = asyncio.ensure_future(chat(h, "s", "hello"))
        await mock.until_pending()
        (running,) = {p.worker for p in mock.pending.values()}
        mock.down.add(running)  # its aborts now fail to connect
        out = await service.pause_rollout(timeout_s=0.3)
        assert list(out["engines_unreachable"]) == [running] and out["still_running"] == 1
        mock.down.clear()
        mock.release()
        await h.post("/v1/rollout/resume", json={"weight_version": 1})
        assert (await call).status_code == 200

    asyncio.run(go())


def test_behind_a_discovery_router_a_dead_worker_fails_one_call_and_its_session_fails_over():
    async def go():
        mock = MockSGLang([W1, W2], router=ROUTER)
        service, h = make(mock, router=True)
        msgs = [{"role": "user", "content": "hello"}]
        r = await h.post("/v1/chat/completions", headers={"X-Session-Id": "s"}, json={"messages": msgs, "max_tokens": 3})
        assert r.status_code == 200
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "go on"}]
        first = service.engines.engine_of("s")
        mock.down.add(first)  # killed; the router still lists it healthy
        again = {"messages": msgs, "max_tokens": 3}
        r = await h.post("/v1/chat/completions", headers={"X-Session-Id": "s"}, json=again)
        assert r.status_code == 502 and r.json()["error"]["type"] == "engine_error"
        assert len(steps(service, "s")) == 1  # nothing recorded
        r = await h.post("/v1/chat/completions", headers={"X-Session-Id": "s"}, json=again)
        assert r.status_code == 200, r.text
        other = service.engines.engine_of("s")
        assert other != first and other in (W1, W2)
        last = steps(service, "s")[-1]
        assert last.metadata["engine"] == other and last.boundary.reason == "engine_failover"
        engines = {e["url"]: e for e in (await h.get("/v1/engines")).json()["engines"]}
        assert engines[first]["healthy"] is False and engines[first]["router_healthy"] is True

    asyncio.run(go())


# ----------------------------------------------------------------------------- upstream clients

def test_a_turn_scope_holds_several_calls_an_sdk_retry_replays_and_a_resend_branches():
    async def go():
        mock = MockSGLang([W1])
        service, h = make(mock)
        first = (await chat(h, "s", "plan", turn="t1", retry=0)).json()
        second = (await chat(h, "s", "act", turn="t1", retry=0)).json()        # same turn, another call
        again = (await chat(h, "s", "plan", turn="t1", retry=1)).json()         # the SDK retried the first
        streamed = await chat(h, "s", "act", turn="t1", retry=2, stream=True)  # a retry that switched to streaming
        assert again == first and second["id"] != first["id"] and streamed.status_code == 200
        assert "data: [DONE]" in streamed.text
        assert (await chat(h, "s", "next", turn="t2")).status_code == 200
        assert len(mock.calls("/generate")) == 3 and service.book.replayed_turns == 2
        # The agent asks the same again (no retry header): a new generation, recorded as a branch.
        resent = (await chat(h, "s", "plan", turn="t1")).json()
        assert resent["id"] != first["id"] and len(mock.calls("/generate")) == 4
        s = service.core.sessions["s"]
        first_step, resent_step = (s.steps[k] for k in sorted(s.steps) if s.steps[k].metadata.get("turn_id") == "t1"
                                   and s.steps[k].messages[-1]["content"] == "plan")
        assert resent_step.parent_id == first_step.parent_id  # a sibling of the first attempt
        fin = (await h.post("/session/finalize", json={"session_id": "s"})).json()
        assert (fin["num_steps"], fin["num_turns"]) == (4, 2)

    asyncio.run(go())


def test_each_weight_version_rule_is_checked_once_per_call():
    async def go():
        mock = MockSGLang([W1])
        service, h = make(mock, partial=False)
        seen: list = []
        for name in ("check_current", "check_generated"):
            real = getattr(service.versions, name)
            setattr(service.versions, name, lambda *a, _n=name, _f=real: seen.append(_n) or _f(*a))
        assert (await chat(h, "s", "one")).status_code == 200
        assert (await chat(h, "s", "two", n=3)).status_code == 200
        r = await h.post("/sessions/s/generate", json={"input_ids": [1, 2, 3]})
        assert r.status_code == 200 and len(steps(service, "s")) == 5
        assert seen == ["check_current", "check_generated"] * 3

    asyncio.run(go())


def test_finalize_twice_answers_the_same_and_takes_instance_and_label():
    async def go():
        mock = MockSGLang([W1])
        service, h = make(mock)
        await chat(h, "s", "q")
        body = {"session_id": "s", "instance_id": "prompt-7", "label": {"answer": 42}, "reward": 1.0}
        first = (await h.post("/session/finalize", json=body)).json()
        again = await h.post("/session/finalize", json={"session_id": "s"})
        assert again.status_code == 200 and again.json() == first
        assert (first["instance_id"], first["label"], first["num_steps"], first["num_segments"]) == \
            ("prompt-7", {"answer": 42}, 1, 1)
        assert service.trajectories.finalized["s"].metadata["label"] == {"answer": 42}
        bad = await h.post("/session/finalize", json={"session_id": "s", "trajectory_build_mode": "concat"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "trajectory_build_mode"
        assert (await h.post("/session/finalize", json={})).json()["error"]["code"] == "missing_session_id"

    asyncio.run(go())


def test_num_turns_counts_an_n_sample_call_once():
    """``n > 1`` choices are sibling steps of one call: ``num_steps`` counts each, ``num_turns`` the call."""
    async def go():
        mock = MockSGLang([W1])
        service, h = make(mock)
        streamed = await chat(h, "t", "one", n=3, stream=True)
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
        assert (await chat(h, "t", "two", n=3)).status_code == 200
        assert (await chat(h, "t", "three", n=2, turn="T1")).status_code == 200
        assert (await chat(h, "t", "four", turn="T1")).status_code == 200     # the same turn again
        assert (await chat(h, "t", "five")).status_code == 200                # a call of its own
        assert sorted(st.metadata.get("sample_index", -1) for st in steps(service, "t")) == \
            [-1, -1, 0, 0, 0, 1, 1, 1, 2, 2]
        fin = (await h.post("/sessions/t/finalize", json={"reward": 1})).json()
        assert (fin["num_steps"], fin["num_turns"]) == (10, 4)

    asyncio.run(go())


def test_header_ids_are_refused_naming_the_header_and_session_ids_reach_their_paths():
    """A session id is a path segment of /sessions/{id}: one with a '/' is refused at the header (400,
    nothing created); ids that round-trip percent-encoded stay valid and reach their session by path.
    A refused turn id names its header."""
    from urllib.parse import quote

    async def go():
        mock = MockSGLang([W1])
        service, h = make(mock)
        for sid in ("a/b", ".."):
            r = await chat(h, sid, "one")
            err = r.json()["error"]
            assert r.status_code == 400 and (err["code"], err["param"]) == ("invalid_session_id", "X-Session-Id")
        r = await h.post("/v1/chat/completions", headers={"X-SMG-Routing-Key": "a/b"},
                         json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
        assert r.status_code == 400 and r.json()["error"]["param"] == "X-SMG-Routing-Key"
        r = await h.post("/v1/chat/completions", json={"session_id": "a/b", "max_tokens": 3,
                                                        "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "session_id"
        r = await chat(h, "s", "one", turn="t" * 257)
        err = r.json()["error"]
        assert r.status_code == 400 and (err["code"], err["param"]) == ("invalid_session_id", "X-Turn-Id")
        assert "turn id" in err["message"]
        assert not service.core.sessions and mock.calls("/generate") == []  # nothing created, nothing sent
        for sid in ("proj:task-1", "6f1c1b9e-2d4a-4a7e-9a55-0c7f3c1e2b10", "a?b#c%d e"):
            assert (await chat(h, sid, "one")).status_code == 200
            path = "/sessions/" + quote(sid, safe="")
            got = await h.get(path)
            assert got.status_code == 200 and got.json()["session_id"] == sid
            fin = await h.post(path + "/finalize", json={"reward": 1})
            assert fin.status_code == 200 and fin.json()["session_id"] == sid

    asyncio.run(go())


def test_finalize_during_an_in_flight_call_waits_so_the_last_call_is_recorded():
    async def go():
        mock = MockSGLang([W1])
        service, h = make(mock)
        await chat(h, "s", "one")
        mock.hold_all = True
        last = asyncio.ensure_future(chat(h, "s", "two"))
        await mock.until_pending()
        fin = asyncio.ensure_future(h.post("/session/finalize", json={"session_id": "s", "reward": 0.5}))
        for _ in range(10_000):  # finalize must come to wait on the call (not finish without it)
            if service.in_flight.waiting("s") or fin.done():
                break
            await asyncio.sleep(0)
        assert service.in_flight.waiting("s") and not fin.done()
        retry = asyncio.ensure_future(h.post("/session/finalize", json={"session_id": "s"}))  # a client's retry
        mock.release()
        assert (await last).status_code == 200
        answer = (await fin).json()
        assert answer["num_steps"] == 2 and answer["in_flight_done"] is True and answer["reward"] == 0.5
        assert (await retry).json() == answer
        # Bounded: with wait_s 0 finalize cuts at once and the late call is refused, not recorded.
        await chat(h, "u", "one")
        mock.hold_all = True
        late = asyncio.ensure_future(chat(h, "u", "two"))
        await mock.until_pending()
        cut = (await h.post("/session/finalize", json={"session_id": "u", "wait_s": 0})).json()
        assert cut["num_steps"] == 1 and cut["in_flight_done"] is False
        mock.release()
        assert (await late).status_code == 409
        assert len(service.trajectories.finalized["u"].segments[0].step_ids) == 1

    asyncio.run(go())


def test_finalize_while_the_only_call_is_in_flight_ends_the_session_as_with_steps():
    """The documented in-flight case holds for a session whose first call is still running: finalize
    waits ``wait_s``, then ends the session (no steps, no Segments, ``in_flight_done: false``) and the
    late call is refused (409), not recorded; the session does not stay active."""
    from dressage.rollout import RolloutManager

    async def go():
        mock = MockSGLang([W1])
        rm = RolloutManager()
        service, h = make(mock, sink=rm)
        mock.hold_all = True
        late = asyncio.ensure_future(chat(h, "e", "one"))
        await mock.until_pending()
        fin = await h.post("/sessions/e/finalize", json={"reward": 1, "wait_s": 0.1})
        assert fin.status_code == 200, fin.text
        answer = fin.json()
        assert (answer["num_steps"], answer["num_turns"], answer["num_segments"], answer["in_flight_done"],
                answer["reward"]) == (0, 0, 0, False, 1.0)
        assert service.core.sessions["e"].state == "finalized"
        assert (await h.post("/session/finalize", json={"session_id": "e"})).json() == answer  # a repeat
        mock.release()
        refused = await late
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "session_state"
        assert not service.core.sessions["e"].steps and service.in_flight.running("e") == 0
        assert service.trajectories.finalized["e"].segments == []
        # It reads as an empty trajectory and leaves as any finalized one does.
        read = (await h.post("/trajectory/read", json={"session_id": "e"})).json()
        assert (read["success"], read["mode"], read["data"]) == (True, "trajectory", [])
        samples = (await h.post("/trajectory/read", json={"session_id": "e", "format": "samples"})).json()
        assert [(t["session_id"], t["reward"], t["samples"]) for t in samples["data"]] == [("e", 1.0, [])]
        batch = (await h.post("/trajectory/read", json={"drain": True})).json()
        assert (batch["success"], batch["data"]) == (True, [[]]) and rm.num_ready == 0
        assert (await h.get("/sessions/e")).status_code == 404  # drained: gone like any read trajectory
        # With nothing in flight, a session without steps is still no trajectory: 409, and it stays active.
        created = (await h.post("/sessions", json={})).json()["session_id"]
        empty = await h.post(f"/sessions/{created}/finalize", json={"wait_s": 0})
        assert empty.status_code == 409 and "no steps" in empty.json()["error"]["message"]
        assert service.core.sessions[created].state == "active"

    asyncio.run(go())


def test_discard_drops_active_finalized_and_aborted_sessions_and_their_keys():
    from dressage.rollout import RolloutManager
    from dressage.tq import TransferQueue

    tq = TransferQueue.start({"deployment": "embedded", "retention_s": None})
    try:
        async def go():
            mock = MockSGLang([W1])
            rm = RolloutManager()
            service, h = make(mock, tq=tq, sink=rm)
            for sid in ("act", "fin", "abo", "keep"):
                assert (await chat(h, sid, "hello", turn="t", retry=0)).status_code == 200
                await service.core.settled(sid)  # the TQ write lands behind the answer
            assert tq.total_keys() == 8
            await h.post("/session/finalize", json={"session_id": "fin"})
            await h.post("/session/finalize", json={"session_id": "keep"})
            await h.post("/sessions/abo/abort")
            assert tq.total_keys() == 6 and "abo" not in service.core.sessions  # aborted: forgotten
            out = (await h.post("/session/discard", json={"session_id": "act"})).json()
            assert (out["success"], out["was"], out["released_refs"]) == (True, "active", 2)
            out = (await h.post("/session/discard", headers={"X-Session-Id": "fin"})).json()
            assert (out["was"], out["samples"]) == ("finalized", 1)
            again = (await h.post("/session/discard", json={"session_id": "fin"})).json()
            assert again["released_refs"] == 0 and again["state"] == "discarded"
            assert (await h.post("/session/discard", json={"session_id": "abo"})).json()["state"] == "aborted"
            by_path = (await h.post("/sessions/fin/discard")).json()  # the path form answers the same
            assert (by_path["state"], by_path["released_refs"]) == ("discarded", 0)
            assert tq.total_keys() == 2 and rm.num_ready == 1
            assert set(service.core.sessions) == {"keep"} and set(service.trajectories.finalized) == {"keep"}
            assert service.trajectories.ledger.get("fin") is None and len(service.turns) == 1
            late = await chat(h, "act", "more")
            assert late.status_code == 409 and "discarded" in late.json()["error"]["message"]
            assert (await h.post("/session/discard", json={"session_id": "act", "force": True})).status_code == 400

        asyncio.run(go())
    finally:
        tq.shutdown()


async def _finalized(h, groups):
    for inst, sids in groups.items():
        for sid in sids:
            assert (await chat(h, sid, f"task {inst}", instance=inst)).status_code == 200
            await h.post("/session/finalize", json={"session_id": sid, "reward": 1.0})


def test_read_by_trajectory_id_returns_exactly_that_trajectory():
    async def go():
        mock = MockSGLang([W1])
        service, h = make(mock)
        await _finalized(h, {"A": ["a1", "a2"], "B": ["b1"]})
        r = (await h.post("/trajectory/read", json={"trajectory_id": "a2"})).json()
        assert (r["success"], r["mode"], r["drained"]) == (True, "trajectory", False)
        assert [(d["trajectory_id"], d["instance_id"]) for d in r["data"]] == [("a2", "A")]
        assert r["meta_info"]["unread_trajectories"] == 3
        filtered = (await h.post("/trajectory/read", json={"session_id": "a2", "instance_id": "B"})).json()
        assert filtered["success"] is False and filtered["data"] == []
        lineage = (await h.post("/trajectory/read", json={"trajectory_id": "b1"})).json()
        timeline = (await h.post("/trajectory/read", json={"trajectory_id": "b1", "segment_view": "timeline"})).json()
        assert timeline["data"][0]["tokens"] == lineage["data"][0]["tokens"] and len(timeline["data"]) == 1
        assert (await h.post("/trajectory/read", json={"traj_id": "a2"})).status_code == 400
        unknown = await h.post("/trajectory/read", json={"trajectory_id": "nope"})
        assert unknown.status_code == 200
        assert (unknown.json()["success"], unknown.json()["meta_info"]["missing"]) == (False, ["nope"])
        await chat(h, "live", "x")
        assert (await h.post("/trajectory/read", json={"trajectory_id": "live"})).status_code == 409

    asyncio.run(go())


def test_max_groups_reads_whole_groups_and_a_drain_hands_them_over():
    async def go():
        mock = MockSGLang([W1])
        service, h = make(mock)
        await _finalized(h, {"A": ["a1", "a2"], "B": ["b1", "b2"], "C": ["c1"]})
        r = (await h.post("/trajectory/read", json={"max_groups": 2, "drain": True})).json()
        assert r["mode"] == "batch" and r["drained"] is True
        assert [sorted({d["trajectory_id"] for d in g}) for g in r["data"]] == [["a1", "a2"], ["b1", "b2"]]
        rest = (await h.post("/trajectory/read", json={"max_groups": 2})).json()
        assert [[d["trajectory_id"] for d in g] for g in rest["data"]] == [["c1"]]
        assert (await h.post("/trajectory/read", json={"max_groups": 0})).status_code == 422
        samples = (await h.post("/trajectory/read", json={"format": "samples", "max_groups": 1})).json()
        assert [t["session_id"] for t in samples["data"]] == ["c1"] and samples["data"][0]["samples"]

    asyncio.run(go())


def test_session_ids_in_the_body_name_the_call_as_upstream_clients_send_them():
    async def go():
        mock = MockSGLang([W1])
        service, h = make(mock)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "session_id": "body-s",
                "instance_id": "9", "turn_id": "t"}
        assert (await h.post("/v1/chat/completions", json=body,
                             headers={"x-stainless-retry-count": "0"})).status_code == 200
        assert (await h.post("/v1/chat/completions", json=body,
                             headers={"x-stainless-retry-count": "1"})).status_code == 200  # replayed
        assert len(steps(service, "body-s")) == 1
        assert service.core.sessions["body-s"].metadata["instance_id"] == "9"
        caps = (await h.get("/integration/capabilities")).json()["dressage"]
        assert "POST /session/discard" in caps["endpoints"] and caps["features"]["finalize_idempotent"]

    asyncio.run(go())


def test_a_finalize_repeated_after_a_restart_is_answered_from_the_journal(tmp_path):
    from dressage.proxy.config import JournalConfig, ProxyConfig
    from dressage.proxy.deployment import build_service

    cfg = ProxyConfig(data_plane=DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True),
                      engines=EnginesConfig(engine_url=W1), journal=JournalConfig(path=str(tmp_path / "journal")))

    def start(mock):
        service, _ = build_service(cfg, engine=engine_clients(cfg.engines, transport=mock.transport()))
        return service, httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(service)),
                                          base_url="http://proxy")

    async def go():
        mock = MockSGLang([W1])
        crashed, h = start(mock)
        await chat(h, "s", "q", turn="t1")
        await chat(h, "s", "r", turn="t2")
        first = (await h.post("/session/finalize", json={"session_id": "s", "reward": 1.0})).json()
        crashed.core.journal.close()  # its process ends: the journal is free for the next Proxy
        restarted, h2 = start(mock)
        again = await h2.post("/session/finalize", json={"session_id": "s"})
        assert again.status_code == 200
        keys = ("num_steps", "num_turns", "num_segments", "reward", "trajectory_id")
        assert [again.json()[k] for k in keys] == [first[k] for k in keys] == [2, 2, 2, 1.0, "s"]

    asyncio.run(go())
