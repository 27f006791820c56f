"""What real agents need from the Proxy, driven by the official openai client over loopback.

Streaming, tool calls across turns, header-identified sessions and turn ids, context safety,
weight-version rules, pause / resume mid-generation and several engines with sticky sessions.
"""

import asyncio
import time

import httpx
import numpy as np
import openai
import pytest

from dressage.testing.stack import start_engine, start_proxy

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "evaluate",
                                            "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]
OTHER_TOOLS = [{"type": "function", "function": {"name": "search", "description": "look up",
                                                  "parameters": {"type": "object",
                                                                 "properties": {"q": {"type": "string"}}}}}]


@pytest.fixture()
def proxy(engine, proxy_stack):
    return proxy_stack(engine.url)


def _new_session(url):
    r = httpx.post(url + "/sessions", timeout=10).json()
    return r["session_id"], r["base_url"]


def _segments(url, sid, reward=1.0):
    assert httpx.post(f"{url}/sessions/{sid}/finalize", json={"reward": reward}, timeout=10).status_code == 200
    return httpx.get(f"{url}/sessions/{sid}/segments", timeout=10).json()


async def _streamed(client, **kw):
    """One streamed call, its deltas accumulated into a message as an agent would (and the content chunks)."""
    content, reasoning, calls, finish, usage, chunks = "", None, {}, None, None, 0
    stream = await client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    async for chunk in stream:
        chunks += any(c.delta.content for c in chunk.choices)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            d = choice.delta
            content += d.content or ""
            extra = getattr(d, "reasoning_content", None) or (d.model_extra or {}).get("reasoning_content")
            if extra:
                reasoning = (reasoning or "") + extra
            for tc in d.tool_calls or ():
                slot = calls.setdefault(tc.index, {"id": None, "type": "function",
                                                   "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.id or slot["id"]
                slot["function"]["name"] += tc.function.name or ""
                slot["function"]["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    msg = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg, finish, usage, chunks


async def _tool_conversation(base_url, *, stream, turns=4, tools=TOOLS):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
    msgs = [{"role": "system", "content": "You can use tools."}, {"role": "user", "content": "What is 6*7?"}]
    replies = []
    for _ in range(turns):
        kw = dict(model="m", messages=msgs, tools=tools, max_tokens=120, temperature=0.7)
        if stream:
            msg, finish, usage, chunks = await _streamed(client, **kw)
            assert usage is not None and usage.completion_tokens >= 1
            if not msg.get("tool_calls") and usage.completion_tokens > 16:
                assert chunks >= 2      # content came as it was generated, not in one block at the end
        else:
            resp = await client.chat.completions.create(**kw)
            msg, finish = resp.choices[0].message.model_dump(exclude_none=True), resp.choices[0].finish_reason
            msg = {k: msg[k] for k in ("role", "content", "tool_calls") if k in msg}
        replies.append((msg, finish))
        msgs.append(msg)
        if msg.get("tool_calls"):
            msgs += [{"role": "tool", "tool_call_id": c["id"], "content": "42"} for c in msg["tool_calls"]]
        else:
            msgs.append({"role": "user", "content": "Check it once more."})
    await client.close()
    return replies


def _same_segment(a, b):
    for key in ("tokens", "prompt_length", "response_length", "loss_mask", "step_ids", "boundary_reason",
                "version_runs", "large_fields"):
        assert a[key] == b[key], key


def test_streamed_and_non_streamed_tool_conversations_record_identical_single_segments(proxy):
    sid_plain, base_plain = _new_session(proxy.url)
    sid_stream, base_stream = _new_session(proxy.url)
    plain = asyncio.run(_tool_conversation(base_plain, stream=False))
    streamed = asyncio.run(_tool_conversation(base_stream, stream=True))
    assert any(m.get("tool_calls") for m, _ in plain), "the engine offered no tool call: pick another seed"
    for (a, fa), (b, fb) in zip(plain, streamed):
        assert fa == fb and (a.get("content") or "").strip() == (b.get("content") or "").strip()
        assert [c["function"] for c in a.get("tool_calls", [])] == [c["function"] for c in b.get("tool_calls", [])]
        if a.get("tool_calls"):
            assert fa == "tool_calls"
    segs_plain, segs_stream = _segments(proxy.url, sid_plain), _segments(proxy.url, sid_stream)
    assert len(segs_plain) == len(segs_stream) == 1          # tool turns kept TITO: one Segment each
    _same_segment(segs_plain[0], segs_stream[0])
    assert len(segs_plain[0]["step_ids"]) == 4 and segs_plain[0]["boundary_reason"] == "new_session"
    steps = proxy.steps(sid_stream)
    assert all(st.parent_id == i - 1 for i, st in steps.items() if i)


def test_changed_tool_schema_is_a_segment_boundary(proxy):
    sid, base = _new_session(proxy.url)
    client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
    msgs = [{"role": "user", "content": "Find it."}]
    r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, max_tokens=16)
    msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "And now?"}]
    client.chat.completions.create(model="m", messages=msgs, tools=OTHER_TOOLS, max_tokens=16)
    segs = _segments(proxy.url, sid)
    assert [s["boundary_reason"] for s in segs] == ["new_session", "tool_schema_change"]


def test_header_sessions_turn_ids_finalize_read_and_stats(proxy):
    url = proxy.url
    headers = {"X-Session-Id": "agent-7", "X-Instance-Id": "3"}
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", default_headers=headers, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["dressage-policy"]
    msgs = [{"role": "user", "content": "hello"}]
    t1 = {"X-Turn-Id": "t1", "Idempotency-Key": "call-1"}
    first = client.chat.completions.create(model="m", messages=msgs, max_tokens=12, extra_headers=t1)
    again = client.chat.completions.create(model="m", messages=msgs, max_tokens=12, extra_headers=t1)
    assert again.id == first.id and again.choices[0].message.content == first.choices[0].message.content
    replay = list(client.chat.completions.create(model="m", messages=msgs, max_tokens=12, stream=True,
                                                 extra_headers=t1))
    assert "".join(c.choices[0].delta.content or "" for c in replay if c.choices).strip() == \
        (first.choices[0].message.content or "").strip()
    # The key names that request: another one under it (here, or on Responses or Messages) is refused,
    # never answered with the first one's reply.
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "other"}],
                                                 "max_tokens": 12}),
                       ("/v1/responses", {"input": "other", "max_output_tokens": 12}),
                       ("/v1/messages", {"model": "m", "max_tokens": 12,
                                         "messages": [{"role": "user", "content": "other"}]})):
        r = httpx.post(url + path, json=body, headers={**headers, **t1})
        assert r.status_code == 422, (path, r.text)
        assert "Idempotency-Key" in r.text and "another request" in r.text
    msgs += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    client.chat.completions.create(model="m", messages=msgs, max_tokens=12, extra_headers={"X-Turn-Id": "t2"})
    session = proxy.service.core.sessions["agent-7"]
    assert len(session.steps) == 2 and session.metadata["group_index"] == 3   # the retried call recorded once
    # The other upstream header and the base-URL form work side by side.
    other = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                          default_headers={"X-SMG-Routing-Key": "agent-8"})
    other.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert len(proxy.steps("agent-8")) == 1
    r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_session_id"
    r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                   headers={"X-Session-Id": "x" * 300})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_session_id"

    fin = httpx.post(url + "/session/finalize", json={"reward": 0.5}, headers={"X-Session-Id": "agent-7"}).json()
    assert (fin["session_id"], fin["trajectory_id"], fin["segments"], fin["reward"]) == ("agent-7", "agent-7", 1, 0.5)
    assert (fin["num_steps"], fin["num_turns"], fin["instance_id"]) == (2, 2, "3")
    stats = httpx.get(url + "/trajectory/stats").json()
    assert stats["sessions"]["finalized"] == 1 and stats["replayed_turns"] == 2 and stats["unread_segments"] == 1
    assert stats["pending_writes"] == 0  # finalize waited for every Step's write
    by_group = httpx.post(url + "/trajectory/read", json={"instance_id": "3"}).json()
    assert [t["session_id"] for t in by_group["trajectories"]] == ["agent-7"]
    read = httpx.post(url + "/trajectory/read", json={"session_id": "agent-7", "drain": True}).json()
    (traj,) = read["trajectories"]
    assert traj["reward"] == 0.5 and traj["metadata"]["instance_id"] == "3"
    assert len(traj["segments"][0]["step_ids"]) == 2
    drained = httpx.post(url + "/trajectory/read", json={"session_id": "agent-7"})  # upstream's answer
    assert drained.status_code == 200
    assert (drained.json()["success"], drained.json()["data"], drained.json()["meta_info"]["missing"]) == \
        (False, [], ["agent-7"])
    assert httpx.post(url + "/trajectory/read", json={"session_id": "agent-8"}).status_code == 409  # active


def test_context_window_clamps_and_overflow_records_nothing():
    eng = start_engine(mean_response_tokens=400, tool_call_rate=0.0)
    p = start_proxy(eng.url, context_length=160, max_output_tokens=100, max_steps_per_session=2)
    try:
        sid, base = _new_session(p.url)
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
        msgs = [{"role": "user", "content": "x" * 60}]
        r = client.chat.completions.create(model="m", messages=msgs, max_tokens=500)
        assert r.usage.total_tokens <= 160 and r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == min(100, 160 - r.usage.prompt_tokens - 1)
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "y" * 400}])
        assert err.value.code == "context_overflow" and err.value.status_code == 400
        assert len(p.steps(sid)) == 1
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "z"}], max_tokens=4)
        with pytest.raises(openai.ConflictError) as err:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "w"}], max_tokens=4)
        assert err.value.code == "max_steps_exceeded" and len(p.steps(sid)) == 2
    finally:
        p.close(); eng.stop()


@pytest.fixture(scope="module")
def slow_engine():
    # 10 ms per token: a pause lands in the middle of an 80-token reply.
    srv = start_engine(mean_response_tokens=2000, tool_call_rate=0.0, token_delay_s=0.01, stream_interval=4)
    yield srv
    srv.stop()


async def _pause_mid_generation(url, calls):
    """Start ``calls`` (coroutines), pause them mid-reply, check nothing runs, resume as version 1."""
    async with httpx.AsyncClient(base_url=url, timeout=20) as h:
        tasks = [asyncio.ensure_future(c) for c in calls]
        for _ in range(200):  # every call reached the engine, whatever the machine's load
            if (await h.get("/v1/rollout/pause_state")).json()["in_flight"] == len(tasks):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # ~20 tokens generated under version 0
        paused = (await h.post("/v1/rollout/pause")).json()
        state = (await h.get("/v1/rollout/pause_state")).json()
        await asyncio.sleep(0.1)
        resumed = (await h.post("/v1/rollout/resume", json={"weight_version": 1})).json()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    return paused, state, resumed, results


def test_pause_resume_mid_generation_gives_one_response_with_two_versions(slow_engine):
    p = start_proxy(slow_engine.url, partial_rollout=True)
    try:
        (sid_a, base_a), (sid_b, base_b) = _new_session(p.url), _new_session(p.url)
        a = openai.AsyncOpenAI(base_url=base_a, api_key="none", max_retries=0)
        b = openai.AsyncOpenAI(base_url=base_b, api_key="none", max_retries=0)
        kw = dict(model="m", messages=[{"role": "user", "content": "Write at length."}], max_tokens=80)
        paused, state, resumed, (plain, streamed) = asyncio.run(_pause_mid_generation(
            p.url, [a.chat.completions.create(**kw), _streamed(b, **kw)]))
        assert paused["aborted"] == 2 and paused["still_running"] == 0
        assert state["paused"] is True and state["in_flight"] == 0
        assert resumed == {"paused": False, "resumed": True, "weight_version": 1, "version": "1"}
        assert plain.usage.completion_tokens == 80 and streamed[2].completion_tokens == 80
        assert streamed[3] >= 5              # content streamed as generated, before and after the pause
        # The recorded reply, read before finalize.
        recorded = p.service.core.sessions[sid_b].steps[0].metadata["assistant_message"]["content"]
        for sid in (sid_a, sid_b):
            (step,) = p.steps(sid).values()        # one response, not two
            assert step.metadata["engine_requests"] == 2
            (seg,) = _segments(p.url, sid)
            (v0, n0), (v1, n1) = seg["version_runs"]
            assert (v0, v1) == (0, 1) and n0 > 0 and n1 > 0 and n0 + n1 == 80
            assert seg["large_fields"]["routed_experts"]["rows"] == len(seg["tokens"]) - 1
            assert seg["large_fields"]["logprobs"]["rows"] == 80
        # A finalized session keeps the conversation of the step that ends its Segment only: its one step here.
        assert p.service.core.sessions[sid_b].steps[0].metadata["assistant_message"]["content"] == recorded
        # The streamed deltas add up to the recorded reply, across the pause.
        assert streamed[0]["content"].strip() == recorded.strip() and len(recorded) > 40
    finally:
        p.close()


def test_weight_version_change_is_rejected_without_partial_rollout(slow_engine):
    p = start_proxy(slow_engine.url)
    try:
        sid, base = _new_session(p.url)
        client = openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0)
        kw = dict(model="m", messages=[{"role": "user", "content": "Write at length."}], max_tokens=60)
        _, _, _, (cut,) = asyncio.run(_pause_mid_generation(p.url, [client.chat.completions.create(**kw)]))
        # Upstream's shape: a 502 its harness reads as an invalidated rollout (detail.error), not retried.
        assert isinstance(cut, openai.InternalServerError) and cut.status_code == 502
        assert cut.code == "generation_preempted" and cut.body is not None
        assert cut.response.json()["detail"]["error"] == "generation_preempted"
        assert cut.response.headers["x-should-retry"] == "false"
        assert len(p.steps(sid)) == 0                     # the cut call left nothing behind
        sid, base = _new_session(p.url)
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
        kw["max_tokens"] = 4
        r = client.chat.completions.create(**kw)
        httpx.post(p.url + "/v1/rollout/resume", json={"weight_version": 2})
        msgs = kw["messages"] + [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go"}]
        with pytest.raises(openai.InternalServerError) as err:
            client.chat.completions.create(**{**kw, "messages": msgs})
        assert err.value.code == "trajectory_version_changed" and "weight version 1" in err.value.message
        assert err.value.status_code == 502
        assert err.value.response.json()["detail"]["error"] == "trajectory_version_changed"
        assert len(p.steps(sid)) == 1
    finally:
        p.close()


def test_client_that_disconnects_mid_stream_leaves_nothing_recorded(slow_engine):
    p = start_proxy(slow_engine.url)
    try:
        sid, base = _new_session(p.url)
        body = {"messages": [{"role": "user", "content": "Write at length."}], "max_tokens": 80, "stream": True}
        seen = []
        with httpx.stream("POST", base + "/chat/completions", json=body, timeout=10) as r:
            for line in r.iter_lines():
                seen.append(line)
                if '"content":"' in line and '"content":""' not in line:
                    break                               # got real content: hang up mid-reply
        assert not any('"finish_reason":"' in line for line in seen)
        time.sleep(1.2)                                 # longer than the whole reply would take
        assert len(p.steps(sid)) == 0
        assert httpx.get(p.url + "/v1/rollout/pause_state").json()["in_flight"] == 0
        # The engine's request was aborted too, not left generating for nobody.
        info = httpx.get(slow_engine.url + "/get_server_info").json()
        assert info["internal_states"][0]["num_running_reqs"] == 0
    finally:
        p.close()


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_header_session_whose_first_stream_is_cut_mid_reply_is_not_kept(slow_engine, endpoint):
    p = start_proxy(slow_engine.url)
    try:
        path, body = _HANG_UP_CALLS[endpoint]
        sid = f"hdr-cut-{endpoint}"
        text = '"content":"' if endpoint == "chat" else '"text":"'
        with httpx.stream("POST", p.url + path, json={**body, "stream": True}, headers={"X-Session-Id": sid},
                          timeout=10) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if text in line and text + '"' not in line:
                    break                               # got real content: hang up mid-reply
        time.sleep(1.2)                                 # longer than the whole reply would take
        assert httpx.get(p.url + "/v1/rollout/pause_state").json()["in_flight"] == 0
        assert httpx.get(f"{p.url}/sessions/{sid}").status_code == 404  # its first call failed: not kept
    finally:
        p.close()


_HANG_UP_CALLS = {  # endpoint -> (path on a session's base URL, body of an 80-token call)
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Write at length."}], "max_tokens": 80}),
    "generate": ("/generate", {"input_ids": [72, 105], "sampling_params": {"max_new_tokens": 80}}),
    "responses": ("/v1/responses", {"model": "m", "input": "Write at length.", "max_output_tokens": 80}),
    "messages": ("/v1/messages", {"model": "m", "max_tokens": 80,
                                  "messages": [{"role": "user", "content": "Write at length."}]}),
    "completions": ("/v1/completions", {"model": "m", "prompt": "Write at length.", "max_tokens": 80}),
}


@pytest.mark.parametrize("endpoint, by_header", [("chat", False), ("generate", False), ("chat", True),
                                                 ("responses", False), ("responses", True),
                                                 ("messages", False), ("messages", True),
                                                 ("completions", False), ("completions", True)])
def test_a_client_that_hangs_up_before_a_whole_answer_leaves_nothing_recorded(slow_engine, endpoint, by_header):
    p = start_proxy(slow_engine.url)
    try:
        path, body = _HANG_UP_CALLS[endpoint]
        sid, _ = _new_session(p.url)
        url, headers = f"{p.url}/sessions/{sid}{path}", {}
        if by_header:
            sid = f"hdr-hangs-up-{endpoint}"
            url, headers = p.url + path, {"X-Session-Id": sid}
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url, json=body, headers=headers, timeout=0.3)  # 80 tokens take ~0.8 s: gone before
        time.sleep(1.2)                                 # longer than the whole reply would take
        assert httpx.get(p.url + "/v1/rollout/pause_state").json()["in_flight"] == 0
        info = httpx.get(slow_engine.url + "/get_server_info").json()
        assert info["internal_states"][0]["num_running_reqs"] == 0  # the engine request was aborted too
        if by_header:  # its first call failed: the session is not kept
            assert httpx.get(f"{p.url}/sessions/{sid}").status_code == 404
        else:
            assert len(p.steps(sid)) == 0
        # The same call left to finish is recorded: the hang-up, not the endpoint, left nothing.
        sid, _ = _new_session(p.url)
        url = f"{p.url}/sessions/{sid}{path}" if not by_header else url
        headers = {"X-Session-Id": sid} if by_header else {}
        assert httpx.post(url, json=body, headers=headers, timeout=20).status_code == 200
        assert len(p.steps(sid)) == 1
    finally:
        p.close()


def test_two_engines_keep_sessions_sticky_and_move_them_when_one_fails():
    e1, e2 = start_engine(), start_engine()
    # Three failed probes in a row take an engine out: one slow answer of a live engine on a loaded
    # machine must not move its sessions.
    p = start_proxy([e1.url, e2.url], health_check_interval_s=0.1, health_check_failures=3)
    try:
        clients = {}
        msgs = {}
        for i in range(8):
            sid = f"sticky-{i}"
            clients[sid] = openai.OpenAI(base_url=p.url + "/v1", api_key="none", max_retries=0,
                                         default_headers={"X-Session-Id": sid})
            msgs[sid] = [{"role": "user", "content": f"task {i}"}]
            for _ in range(2):
                r = clients[sid].chat.completions.create(model="m", messages=msgs[sid], max_tokens=8)
                msgs[sid] += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
        where = {sid: {st.metadata["engine"] for st in p.steps(sid).values()} for sid in clients}
        assert all(len(urls) == 1 for urls in where.values())            # sticky
        assert {u for urls in where.values() for u in urls} == {e1.url, e2.url}
        moved = [sid for sid, urls in where.items() if urls == {e2.url}]
        e2.stop()
        deadline = time.time() + 30  # a bound on the wait, not a speed requirement
        while time.time() < deadline:
            engines = httpx.get(p.url + "/v1/engines").json()["engines"]
            if not next(e for e in engines if e["url"] == e2.url)["healthy"]:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the stopped engine was never taken out")
        sid = moved[0]
        clients[sid].chat.completions.create(model="m", messages=msgs[sid], max_tokens=8)
        assert p.steps(sid)[2].metadata["engine"] == e1.url
        fin = httpx.post(p.url + "/session/finalize", json={"session_id": sid}).json()
        assert fin["segments"] == 2
        segs = p.service.trajectories.finalized[sid].segments
        assert [s.boundary_reason for s in segs] == ["new_session", "engine_failover"]
        np.testing.assert_array_equal(segs[1].tokens[:len(segs[0].tokens)], segs[0].tokens)
    finally:
        p.close(); e1.stop(); e2.stop()


def test_concurrent_retries_of_one_call_generate_and_record_once(slow_engine):
    p = start_proxy(slow_engine.url)
    try:
        client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="none", max_retries=0,
                                    default_headers={"X-Session-Id": "dup", "X-Turn-Id": "turn-1",
                                                     "Idempotency-Key": "once"})
        kw = dict(model="m", messages=[{"role": "user", "content": "Write at length."}], max_tokens=20)

        async def both():
            return await asyncio.gather(client.chat.completions.create(**kw), _streamed(client, **kw))

        first, (streamed, finish, usage, _) = asyncio.run(both())
        assert p.service.book.calls == 1 and len(p.steps("dup")) == 1      # the retry waited for the first
        assert streamed["content"].strip() == first.choices[0].message.content.strip()
        assert usage.completion_tokens == first.usage.completion_tokens == 20 and finish == "length"
    finally:
        p.close()
