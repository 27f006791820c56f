"""The real Proxy server and engine over loopback, driven by the official openai client."""

import asyncio
import socket

import httpx
import numpy as np
import openai
import pytest

from dressage.fields import get_model
from dressage.testing.stack import start_proxy
from dressage.tq import TransferQueue
from dressage.train import samples_digest

MODEL = get_model("tiny-moe")
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "evaluate",
                                            "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]


async def _conversation(url, turns=4, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers) as h:
        r = (await h.post(url + "/sessions", json={"metadata": {"group_index": 0, "sample_index": 0}})).json()
        client = openai.AsyncOpenAI(base_url=r["base_url"], api_key=token or "none")
        msgs = [{"role": "system", "content": "You can use tools."}, {"role": "user", "content": "What is 6*7?"}]
        for _ in range(turns):
            resp = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, max_tokens=48,
                                                        temperature=0.7)
            msg = resp.choices[0].message
            msgs.append(msg.model_dump(exclude_none=True))
            if msg.tool_calls:
                msgs += [{"role": "tool", "tool_call_id": c.id, "content": "42"} for c in msg.tool_calls]
            else:
                msgs.append({"role": "user", "content": "Check it once more."})
        await client.close()
        sid = r["session_id"]
        fin = (await h.post(f"{url}/sessions/{sid}/finalize", json={"reward": 1.0})).json()
        segs = (await h.get(f"{url}/sessions/{sid}/segments")).json()
        return sid, fin, segs


def test_openai_client_tito_conversation_is_one_segment_and_tq_on_equals_off(engine, proxy_stack, restore_batch):
    off_server = proxy_stack(engine.url, routed_experts_dtype="uint8", dp_size=2)
    tq = TransferQueue.start({"deployment": "embedded"})
    on_server = proxy_stack(engine.url, tq=tq, routed_experts_dtype="uint8", dp_size=2)
    off_rm, on_rm = off_server.manager, on_server.manager
    try:
        _, fin_off, segs_off = asyncio.run(_conversation(off_server.url))
        _, fin_on, segs_on = asyncio.run(_conversation(on_server.url))
        assert fin_off["segments"] == fin_on["segments"] == 1        # TITO kept every turn in one lineage
        (seg,) = segs_on
        assert seg["boundary_reason"] == "new_session" and len(seg["step_ids"]) == 4
        assert len(seg["loss_mask"]) == seg["response_length"]
        assert seg["large_fields"]["routed_experts"]["rows"] == len(seg["tokens"]) - 1
        assert seg["large_fields"]["routed_experts"]["resident"] is False
        assert segs_off[0]["tokens"] == seg["tokens"]
        off, on = restore_batch(off_rm, None), restore_batch(on_rm, tq)
        assert samples_digest(off) == samples_digest(on)
        for a, b in zip(off, on):
            np.testing.assert_array_equal(a.rollout_routed_experts, b.rollout_routed_experts)
            np.testing.assert_array_equal(a.rollout_log_probs, b.rollout_log_probs)
            assert b.rollout_routed_experts.shape == (len(b.tokens) - 1, MODEL.num_layers, MODEL.topk)
        assert tq.total_keys() == 0
    finally:
        on_server.close(); tq.shutdown()


@pytest.fixture(scope="module")
def proxy(engine):
    with start_proxy(engine.url, routed_experts_dtype="uint8", dp_size=2) as stack:
        yield stack.proxy


def _post(url, **kw):
    return httpx.post(url, timeout=20, **kw)


def test_http_errors_are_clear_and_server_keeps_serving(proxy):
    url = proxy.url
    sid = _post(url + "/sessions").json()["session_id"]
    chat = f"{url}/sessions/{sid}/v1/chat/completions"
    r = _post(chat, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]
    r = _post(chat, content=b'{"messages": [{"role": "user", "content": "\xff"}]}',
              headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON: the body could not be read (UnicodeDecodeError" \
        in r.json()["error"]["message"]
    r = _post(chat, content=b'{"messages": [{"role": "user", "content": "x"}]}', headers={"content-type": "text/plain"})
    assert r.status_code == 400 and "sent as application/json (this one came as text/plain)" \
        in r.json()["error"]["message"]
    r = _post(chat, json={"messages": [{"role": "user", "content": "x"}], "max_tokens": "lots"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"  # a string is not a number
    r = _post(chat, json={"messages": [{"role": "wizard", "content": "x"}]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "messages.0.role"
    r = _post(chat, json={"messages": []})
    assert r.status_code == 422 and r.json()["error"]["param"] == "messages"
    r = _post(chat, json={"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})
    assert r.status_code == 422 and r.json()["error"]["param"] == "tool_choice"
    r = _post(f"{url}/sessions/nope/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    r = _post(f"{url}/sessions/{sid}/generate", json={"input_ids": [-3]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "input_ids"
    ok = _post(chat, json={"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    first = _post(f"{url}/sessions/{sid}/finalize", json={"reward": 0.5})
    assert first.status_code == 200
    r = _post(chat, json={"messages": [{"role": "user", "content": "again"}]})
    assert r.status_code == 409 and "finalized" in r.json()["error"]["message"]
    again = _post(f"{url}/sessions/{sid}/finalize", json={})  # a client's retry: the same answer, once
    assert again.status_code == 200 and again.json() == first.json() and again.json()["reward"] == 0.5
    r = _post(f"{url}/sessions/{sid}/finalize", json={"reward": 1, "trajectory_build_mode": "concat"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "trajectory_build_mode"
    r = _post(url + "/sessions", content=b"x" * 100, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert httpx.get(url + "/health").json()["status"] == "ok"


def test_token_level_generate_records_a_step(proxy):
    url = proxy.url
    sid = _post(url + "/sessions").json()["session_id"]
    r1 = _post(f"{url}/sessions/{sid}/generate", json={"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 5}})
    assert r1.status_code == 200, r1.text
    out = r1.json()["output_ids"]
    r2 = _post(f"{url}/sessions/{sid}/generate",
               json={"input_ids": [1, 2, 3, 4, *out, 7, 8], "sampling_params": {"max_new_tokens": 5}}).json()
    assert r2["parent_id"] == r1.json()["step_id"] and r2["lineage_id"] == r1.json()["lineage_id"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_upstream_down_is_502_and_nothing_recorded(proxy_stack):
    # the engine is never up
    server = proxy_stack(f"http://127.0.0.1:{_free_port()}", routed_experts_dtype="uint8", check_engine=False)
    sid = _post(server.url + "/sessions").json()["session_id"]
    r = _post(f"{server.url}/sessions/{sid}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 502 and r.json()["error"]["type"] == "engine_error"
    assert httpx.get(f"{server.url}/sessions/{sid}").json()["steps"] == 0


def test_bearer_token_is_required_when_set(engine, proxy_stack):
    server = proxy_stack(engine.url, routed_experts_dtype="uint8", api_token="s3cret")
    assert _post(server.url + "/sessions").status_code == 401
    assert _post(server.url + "/sessions", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(server.url + "/health").status_code == 200
    _, fin, _ = asyncio.run(_conversation(server.url, turns=2, token="s3cret"))
    assert fin["segments"] == 1


def test_a_stopped_proxy_closed_the_engine_connections_it_opened(engine):
    """The Proxy's own engine clients keep their connection pool on the server's event loop; stopping the
    server closes it there (an unclosed pool would be reported at exit)."""
    stack = start_proxy(engine.url)
    sid = httpx.post(stack.url + "/sessions", json={}).json()["session_id"]
    r = httpx.post(f"{stack.url}/sessions/{sid}/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 200
    pools = [s for m in stack.service.engines.members.values() for s in m.client._transport._sessions.values()]
    assert pools and not any(s.closed for s in pools)
    stack.close()
    assert all(s.closed for s in pools)
