"""Upstream-client use cases below HTTP: trajectory read selection, finalize ledger, in-flight waits, turns."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from dressage.errors import ConfigError
from dressage.proxy.recording.lifecycle import InFlight
from dressage.proxy.upstream.ledger import FinalizeLedger, count_turns
from dressage.proxy.schemas import FinalizeSessionRequest, PauseRequest, ResumeRequest, TrajectoryReadRequest
from dressage.proxy.upstream.read import read_answer, select_trajectories
from dressage.proxy.recording.turn_scope import request_hash, turn_call_key, turn_of


class Seg:
    def __init__(self, sid, i):
        self.session_id, self.index = sid, i
        self.tokens, self.prompt_length = np.array([1, 2]), 1
        self.loss_mask, self.token_versions = np.array([1]), np.array([0])
        self.large, self.boundary_reason, self.step_ids, self.total_length = {}, "end", (i,), 2

    def to_summary(self):
        return {"session_id": self.session_id, "index": self.index, "tokens": [1, 2]}


def done(sid, inst=None, segs=1, reward=1.0, label=None):
    meta = {} if inst is None else {"instance_id": inst}
    if label is not None:
        meta["label"] = label
    return SimpleNamespace(session_id=sid, metadata=meta, reward=reward, segments=[Seg(sid, i) for i in range(segs)])


def store():
    return {"a1": done("a1", "A", 2), "b1": done("b1", "B"), "a2": done("a2", "A"), "c1": done("c1", "C"),
            "solo": done("solo")}


def test_read_by_trajectory_id_reads_exactly_that_one():
    sel = select_trajectories(store(), trajectory_id="a1", instance_id="A")
    assert sel.mode == "trajectory" and sel.session_ids == ["a1"]
    answer = read_answer(sel, store(), drained=False, stats={"unread": 5})
    assert answer["success"] and answer["mode"] == "trajectory"
    assert [(r["trajectory_id"], r["segment_index"], r["segment_count"]) for r in answer["data"]] == [
        ("a1", 0, 2), ("a1", 1, 2)]
    assert answer["data"][0]["instance_id"] == "A" and answer["meta_info"]["unread"] == 5


def test_instance_id_only_filters_a_named_read():
    sel = select_trajectories(store(), session_id="a1", instance_id="B")
    assert sel.session_ids == [] and sel.missing == []
    assert read_answer(sel, store(), drained=False, stats={})["success"] is False
    sel = select_trajectories(store(), session_ids=["a1", "ghost"])
    assert sel.session_ids == ["a1"] and sel.missing == ["ghost"]


def test_batch_reads_whole_groups_up_to_max_groups():
    sel = select_trajectories(store(), max_groups=2)
    assert sel.mode == "batch" and sel.groups == [["a1", "a2"], ["b1"]]
    answer = read_answer(sel, store(), drained=True, stats={})
    assert [[r["trajectory_id"] for r in g] for g in answer["data"]] == [["a1", "a1", "a2"], ["b1"]]
    assert answer["drained"] is True and answer["meta_info"]["groups"] == 2
    assert select_trajectories(store(), instance_id="A").groups == [["a1", "a2"]]
    assert select_trajectories(store()).groups[-1] == ["solo"]


def test_conflicting_or_bad_read_requests_are_refused():
    with pytest.raises(ConfigError):
        select_trajectories(store(), trajectory_id="a1", session_id="b1")
    with pytest.raises(ConfigError):
        select_trajectories(store(), max_groups=0)
    for bad in ({"max_groups": 0}, {"segment_view": "flat"}, {"traj_id": "x"}):
        with pytest.raises(Exception):
            TrajectoryReadRequest(**bad)


def test_control_bodies_refuse_unknown_keys_and_accept_upstream_fields():
    assert ResumeRequest(version="step-3").requested() == "step-3"
    assert ResumeRequest(weight_version=2, version="2").requested() == 2
    with pytest.raises(ValueError):
        ResumeRequest(weight_version=2, version="3").requested()
    with pytest.raises(Exception):
        ResumeRequest(new_version="x")
    body = FinalizeSessionRequest(session_id="s", instance_id="i", label={"answer": 4})
    assert body.label == {"answer": 4}
    with pytest.raises(Exception):
        FinalizeSessionRequest(session_id="s", trajectory_build_mode="concat")
    assert PauseRequest(session_id="s", reason="weight_update", mode="preempt", timeout_seconds=5).session_id == "s"


def test_finalize_ledger_keeps_the_newest_answers():
    ledger = FinalizeLedger(capacity=2)
    for sid in ("a", "b", "c"):
        ledger.put(sid, {"session_id": sid})
    assert ledger.get("a") is None and ledger.get("c") == {"session_id": "c"} and len(ledger) == 2


def test_wait_idle_returns_when_the_last_call_ends_or_times_out():
    async def scenario():
        calls = InFlight()
        calls.enter("s")
        calls.enter("s")
        waiter = asyncio.ensure_future(calls.wait_idle("s", 5))
        await asyncio.sleep(0)
        calls.exit("s")
        await asyncio.sleep(0)
        assert not waiter.done() and calls.running("s") == 1
        calls.exit("s")
        assert await waiter is True
        calls.enter("t")
        return await calls.wait_idle("t", 0.01), await calls.wait_idle("nobody", 0.01)

    assert asyncio.run(scenario()) == (False, True)


def test_turns_and_steps_are_counted_apart():
    steps = [SimpleNamespace(metadata={"turn_id": "t1"}), SimpleNamespace(metadata={"turn_id": "t1"}),
             SimpleNamespace(metadata={"turn_id": "t2"}), SimpleNamespace(metadata={})]
    assert count_turns(steps) == 3 and len(steps) == 4


def test_turn_call_key_separates_bodies_but_not_delivery():
    a = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    assert turn_call_key("t", a) == turn_call_key("t", {**a, "stream": True, "stream_options": {"x": 1}})
    assert turn_call_key("t", a) != turn_call_key("t", {**a, "max_tokens": 9})
    assert turn_of(turn_call_key("t-1", a)) == "t-1" and len(request_hash(a)) == 24


class _Engine:
    def __init__(self):
        self.aborted = []

    async def abort(self, rid):
        self.aborted.append(rid)


def test_pause_scoped_to_a_session_cuts_and_holds_only_that_session():
    from dressage.proxy.recording.pause import RolloutPause

    async def scenario():
        pause, engine = RolloutPause(0, abort_timeout_s=0.2, abort_retry_s=0.01), _Engine()
        runs = {}

        async def call(rid, sid, inst):
            async with pause.track(rid, engine, session_id=sid, instance_id=inst) as run:
                runs[rid] = run
                while not engine.aborted.count(rid) and not stop.is_set():
                    await asyncio.sleep(0.005)

        stop = asyncio.Event()
        tasks = [asyncio.ensure_future(call("r-a", "A", "g1")), asyncio.ensure_future(call("r-b", "B", "g1")),
                 asyncio.ensure_future(call("r-c", "C", "g2"))]
        await asyncio.sleep(0.02)
        out = await pause.pause(session_id="A")
        assert out["aborted"] == 1 and out["scope"] == {"session_id": "A", "instance_id": None}
        assert engine.aborted == ["r-a"] and runs["r-a"].aborted and not runs["r-b"].aborted
        assert pause.blocked("A") and not pause.blocked("B") and not pause.paused
        assert await pause.wait_running(0.01, session_id="B") is True
        assert await pause.wait_running(0.01, session_id="A") is False
        out = await pause.pause(instance_id="g1")
        assert sorted(engine.aborted) == ["r-a", "r-b"] and pause.blocked("Z", "g1") and not pause.blocked("C", "g2")
        assert pause.state()["paused_scopes"] == ["instance:g1", "session:A"]
        resumed = pause.resume("v9")
        assert resumed["resumed"] is True and not pause.blocked("A", "g1") and resumed["version"] == "v9"
        stop.set()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
