"""Upstream Dressage's clients against our Proxy, as black-box HTTP: its Segment objects expand into the
same slime Samples as our ``format: samples``; its exact reads of unknown or drained trajectories; its
finalize / discard keys; its capability document."""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import httpx
import pytest
import numpy as np

from dressage.trajectory.sample_wire import sample_from_wire

ENGINE = {"tool_call_rate": 0.0}


def _call(url: str, sid: str, content: str, **headers: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": content}], "max_tokens": 8},
                      headers={"X-Session-Id": sid, **headers}, timeout=30)


def _upstream_sample(segment: dict, num_layers: int, topk: int) -> dict:
    """What upstream's rollout consumer makes of one Segment object (its documented expansion):
    the response starts at the first trainable token; per-token arrays are cut there."""
    for key in ("tokens", "full_loss_mask", "full_logprobs"):
        assert key in segment, f"selected segment missing required field: {key}"
    tokens, mask = segment["tokens"], segment["full_loss_mask"]
    assert len(mask) == len(tokens) == len(segment["full_logprobs"]) == len(segment["full_versions"])
    start = next((i for i, m in enumerate(mask) if m == 1), len(tokens))
    rows = [np.frombuffer(base64.b64decode(c["data"]), dtype=c["dtype"]).astype(np.int32).reshape(-1, num_layers, topk)
            for c in segment["routed_experts_chunks"]]
    return {"tokens": tokens, "response_length": len(tokens) - start, "loss_mask": mask[start:],
            "rollout_log_probs": np.asarray(segment["full_logprobs"][start:], dtype=np.float32),
            "rollout_routed_experts": np.concatenate(rows)[:len(tokens) - 1]}


def test_multi_segment_read_in_upstreams_format_expands_into_our_samples(engine, proxy_stack):
    proxy = proxy_stack(engine.url)
    url = proxy.url
    # A rewritten history starts a second Segment in the same session.
    assert _call(url, "ms", "first question").status_code == 200
    assert _call(url, "ms", "an unrelated history").status_code == 200
    fin = httpx.post(url + "/session/finalize", json={"session_id": "ms", "instance_id": "g1", "reward": 1.0}).json()
    assert fin["success"] is True and fin["num_segments"] == 2 and fin["finalization_id"]

    ours = httpx.post(url + "/trajectory/read", json={"session_id": "ms", "format": "samples"}).json()
    samples = [sample_from_wire(s) for s in ours["data"][0]["samples"]]
    theirs = httpx.post(url + "/trajectory/read", json={"trajectory_id": "ms"}).json()
    assert theirs["success"] is True and theirs["mode"] == "trajectory"
    segments = sorted(theirs["data"], key=lambda s: s["segment_index"])
    assert [s["segment_index"] for s in segments] == [0, 1] and {s["segment_count"] for s in segments} == {2}
    # Upstream's Harbor integration: one finalization, complete, named the same as the finalize answer.
    assert {(s["extra_info"]["finalization_id"], s["extra_info"]["finalization_complete"]) for s in segments} \
        == {(fin["finalization_id"], True)}
    model = proxy.service.core.config.model
    assert len(samples) == len(segments) == 2
    for ours_s, seg in zip(samples, segments):
        up = _upstream_sample(seg, model.num_layers, model.topk)
        assert up["tokens"] == ours_s.tokens.tolist()
        assert up["response_length"] == ours_s.response_length
        assert up["loss_mask"] == ours_s.loss_mask.tolist()
        np.testing.assert_array_equal(up["rollout_log_probs"], ours_s.rollout_log_probs)
        np.testing.assert_array_equal(up["rollout_routed_experts"], ours_s.rollout_routed_experts)
        assert seg["full_versions"][len(seg["tokens"]) - ours_s.response_length:] == \
            [str(v) for v in ours_s.token_versions.tolist()]


def test_exact_read_of_unknown_or_drained_trajectory_is_200_without_success(engine, proxy_stack):
    url = proxy_stack(engine.url).url
    unknown = httpx.post(url + "/trajectory/read", json={"trajectory_id": "never"})
    assert unknown.status_code == 200
    assert (unknown.json()["success"], unknown.json()["data"], unknown.json()["mode"]) == (False, [], "trajectory")
    assert _call(url, "d1", "hello").status_code == 200
    assert httpx.post(url + "/session/finalize", json={"session_id": "d1"}).status_code == 200
    first = httpx.post(url + "/trajectory/read", json={"trajectory_id": "d1", "drain": True}).json()
    assert first["success"] is True and first["drained"] is True and len(first["data"]) == 1
    again = httpx.post(url + "/trajectory/read", json={"trajectory_id": "d1"})
    assert again.status_code == 200 and again.json()["success"] is False and again.json()["data"] == []
    # Our own Sample reads stay strict: a trainer asking for a trajectory that is gone is told so.
    strict = httpx.post(url + "/trajectory/read", json={"trajectory_id": "d1", "format": "samples"})
    assert strict.status_code == 404


def test_discard_answers_upstreams_keys(engine, proxy_stack):
    url = proxy_stack(engine.url).url
    assert _call(url, "x1", "hello").status_code == 200
    assert httpx.post(url + "/session/finalize", json={"session_id": "x1"}).status_code == 200
    out = httpx.post(url + "/session/discard", json={"session_id": "x1"}).json()
    assert (out["success"], out["session_id"], out["session_removed"], out["segments_removed"]) == \
        (True, "x1", True, 1)
    again = httpx.post(url + "/session/discard", json={"session_id": "x1"}).json()
    assert (again["success"], again["session_removed"], again["segments_removed"]) == (True, False, 0)


def test_capabilities_answer_upstreams_schema_with_ours_nested(engine, proxy_stack):
    url = proxy_stack(engine.url, max_output_tokens=64).url
    caps = httpx.get(url + "/integration/capabilities").json()
    assert caps["schema_version"] == "dressage.proxy.integration/v1"
    upstream_keys = {"token_build_mode", "token_build_model", "tokenizer_id", "chat_template_fingerprint",
                     "record_token_versions", "mask_nonlast_version_tokens", "max_output_tokens", "partial_rollout",
                     "max_partial_rollout_preempts", "current_weight_version", "cached_weight_version",
                     "weight_version_authoritative", "weight_versions_consistent", "weight_version_source",
                     "weight_version_worker_count", "supports_expected_version"}
    assert upstream_keys <= set(caps)
    assert (caps["token_build_mode"], caps["record_token_versions"], caps["max_output_tokens"]) == ("tito", True, 64)
    assert caps["chat_template_fingerprint"] is None   # the byte tokenizer has no template source
    assert caps["dressage"]["service"] == "dressage-proxy" and "POST /trajectory/read" in caps["dressage"]["endpoints"]
    # Every field the read takes, and every mode its answer names (``format: samples`` answers ``samples``).
    features = caps["dressage"]["features"]
    assert features["trajectory_read_modes"] == ["trajectory", "batch", "samples"]
    assert {"lease", "lease_s", "format", "min_group_size", "group_timeout_s", "drain"} <= \
        set(features["trajectory_read_fields"])
    bogus = httpx.post(url + "/trajectory/read", json={"no_such_field": 1})
    assert bogus.status_code == 400 and "no_such_field" not in features["trajectory_read_fields"]


def test_upstreams_launch_flags_start_the_proxy_as_its_own_module(engine):
    """``python -m dressage.proxy.server`` with the proxy arguments of upstream's blackbox launch script
    (its tokenizer and router swapped for this test's) serves chat and reads in upstream's shapes."""
    args = ["--tokenizer-path", "byte", "--host", "127.0.0.1", "--port", "0", "--token-build-mode", "tito",
            "--token-build-model", "qwen3_5", "--tito-model", "qwen3_5", "--model-mask-type", "qwen3_5",
            "--model-tool-call-type", "qwen3_5", "--tool-call-parse-backend", "local", "--model-reasoning-type",
            "qwen3", "--reasoning-parse-backend", "local", "--rollout-temperature", "1.0", "--context-window", "4096",
            "--record-token-versions", "--mask-nonlast-version-tokens", "--dressage-partial-rollout",
            "--sglang-router-url", engine.url, "--model", "tiny-moe"]
    src = os.path.join(os.path.dirname(__file__), "..", "..", "..", "src")
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "dressage.proxy.server", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = ""
        for line in proc.stdout:
            if "serving on" in line:
                break
        assert "serving on" in line, line
        url = line.split("serving on ", 1)[1].split(" ", 1)[0]
        assert _call(url, "up1", "hello").status_code == 200
        fin = httpx.post(url + "/session/finalize", json={"session_id": "up1"}).json()
        assert fin["success"] is True and fin["finalization_id"]
        read = httpx.post(url + "/trajectory/read", json={"trajectory_id": "up1"}).json()
        (seg,) = read["data"]
        assert seg["extra_info"]["mask_nonlast_version_tokens"] is True and len(seg["full_versions"]) == \
            len(seg["tokens"])
        caps = httpx.get(url + "/integration/capabilities").json()
        assert (caps["token_build_model"], caps["partial_rollout"], caps["mask_nonlast_version_tokens"]) == \
            ("qwen3_5", True, True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_session_spanning_more_versions_than_allowed_gets_upstreams_502(engine, proxy_stack):
    proxy = proxy_stack(engine.url, partial_rollout=True, max_partial_rollout_preempts=0)
    url = proxy.url
    assert _call(url, "pr", "first").status_code == 200
    assert httpx.post(url + "/v1/rollout/resume", json={"weight_version": 1}).status_code == 200
    cut = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "again"}],
                                                         "max_tokens": 8}, headers={"X-Session-Id": "pr"})
    assert cut.status_code == 502 and cut.headers["x-should-retry"] == "false"
    detail = cut.json()["detail"]
    assert (detail["error"], detail["versions"], detail["version_switches"], detail["max_preempts"]) == \
        ("partial_rollout_staleness_exceeded", ["0", "1"], 1, 0)
    assert cut.json()["error"]["code"] == "partial_rollout_staleness_exceeded"
    assert len(proxy.steps("pr")) == 1                     # nothing recorded for the refused call
    # A new session under the new version is within the limit.
    assert _call(url, "pr2", "fresh").status_code == 200


def test_one_version_change_is_within_one_allowed_preempt(engine, proxy_stack):
    proxy = proxy_stack(engine.url, partial_rollout=True, max_partial_rollout_preempts=1)
    assert _call(proxy.url, "ok", "first").status_code == 200
    httpx.post(proxy.url + "/v1/rollout/resume", json={"weight_version": 1})
    assert _call(proxy.url, "ok", "second").status_code == 200
    httpx.post(proxy.url + "/v1/rollout/resume", json={"weight_version": 2})
    assert _call(proxy.url, "ok", "third").json()["detail"]["error"] == "partial_rollout_staleness_exceeded"
    assert len(proxy.steps("ok")) == 2


def _sse_lines(url: str, sid: str) -> list[str]:
    with httpx.stream("POST", url + "/v1/chat/completions", headers={"X-Session-Id": sid}, timeout=30,
                      json={"messages": [{"role": "user", "content": "Write at length."}], "max_tokens": 24,
                            "stream": True}) as r:
        assert r.status_code == 200
        return [line for line in r.iter_lines() if line]


def test_quiet_streams_carry_heartbeat_comments_and_the_same_reply(proxy_stack):
    from dressage.testing.stack import start_engine

    # 4 tokens per engine frame, 10 ms a token: the stream is quiet far longer than the heartbeat.
    slow = start_engine(mean_response_tokens=2000, tool_call_rate=0.0, token_delay_s=0.01, stream_interval=4)
    try:
        beating = proxy_stack(slow.url, stream_heartbeat_interval_s=0.002)
        lines = _sse_lines(beating.url, "hb")
        assert ": dressage-heartbeat" in lines and lines[-1] == "data: [DONE]"
        silent = proxy_stack(slow.url, stream_heartbeat_interval_s=0)
        assert ": dressage-heartbeat" not in _sse_lines(silent.url, "quiet")
        recorded = beating.steps("hb")
        assert len(recorded) == 1 and len(next(iter(recorded.values())).response_ids) == 24
    finally:
        slow.stop()


def test_a_resend_under_the_same_turn_generates_again_as_a_branch(engine, proxy_stack):
    proxy = proxy_stack(engine.url)
    body = {"messages": [{"role": "user", "content": "parse this"}], "max_tokens": 8}
    h = {"X-Session-Id": "rs", "X-Turn-Id": "t1"}
    first = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers=h).json()
    again = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers=h).json()
    assert again["id"] != first["id"] and proxy.service.book.calls == 2 and proxy.service.book.replayed_turns == 0
    a, b = (proxy.steps("rs")[k] for k in sorted(proxy.steps("rs")))
    assert a.parent_id == b.parent_id and a.metadata["turn_id"] == b.metadata["turn_id"] == "t1"  # siblings
    fin = httpx.post(proxy.url + "/session/finalize", json={"session_id": "rs"}).json()
    assert (fin["num_steps"], fin["num_turns"]) == (2, 1)


def test_an_idempotency_key_retry_is_replayed_without_an_engine_call(engine, proxy_stack):
    proxy = proxy_stack(engine.url)
    body = {"messages": [{"role": "user", "content": "once"}], "max_tokens": 8}
    h = {"X-Session-Id": "ik", "Idempotency-Key": "req-42"}
    first = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers=h).json()
    again = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers=h).json()
    assert again == first and proxy.service.book.calls == 1 and len(proxy.steps("ik")) == 1
    other = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers={**h, "Idempotency-Key": "req-43"})
    assert other.json()["id"] != first["id"] and len(proxy.steps("ik")) == 2


class _LostFirstAnswer(httpx.BaseTransport):
    """The first chat answer is lost on the way back (the Proxy recorded it): the SDK retries by itself."""

    def __init__(self) -> None:
        self.inner, self.sent = httpx.HTTPTransport(), []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.headers.get("x-stainless-retry-count"), request.content))
        response = self.inner.handle_request(request)
        if len(self.sent) == 1:
            response.read()
            response.close()
            raise httpx.ReadError("connection reset", request=request)
        return response


def test_the_openai_sdks_own_retry_of_an_identical_body_is_replayed(engine, proxy_stack):
    import openai

    proxy = proxy_stack(engine.url)
    transport = _LostFirstAnswer()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="none", max_retries=2,
                           default_headers={"X-Session-Id": "sdk", "X-Turn-Id": "t1"},
                           http_client=httpx.Client(transport=transport))
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert [count for count, _ in transport.sent] == ["0", "1"] and transport.sent[0][1] == transport.sent[1][1]
    assert proxy.service.book.calls == 1 and proxy.service.book.replayed_turns == 1
    (step,) = proxy.steps("sdk").values()
    assert reply.usage.completion_tokens == len(step.response_ids)


def test_expected_version_pins_the_call_and_a_moved_policy_is_upstreams_502(engine, proxy_stack):
    proxy = proxy_stack(engine.url, partial_rollout=True)
    url = proxy.url
    assert _call(url, "ev", "hello", **{"X-Dressage-Expected-Version": "0"}).status_code == 200
    httpx.post(url + "/v1/rollout/resume", json={"weight_version": 1})
    moved = _call(url, "ev", "again", **{"X-Dressage-Expected-Version": "0"})
    assert moved.status_code == 502
    assert {k: moved.json()["detail"][k] for k in ("error", "expected", "observed", "session_id")} == \
        {"error": "weight_version_mismatch", "expected": "0", "observed": "1", "session_id": "ev"}
    assert len(proxy.steps("ev")) == 1                            # nothing recorded for the refused call
    assert _call(url, "ev", "again", **{"X-Dressage-Expected-Version": "1"}).status_code == 200
    assert httpx.get(url + "/integration/capabilities").json()["supports_expected_version"] is True


HOOKS = '''
import json, pathlib
from dressage.proxy.tool_call_hooks import ToolCallHook, register_tool_call_hook

LOG = pathlib.Path(__file__).with_suffix(".log")


def note(stage, ctx):
    with LOG.open("a") as f:
        f.write(json.dumps({"stage": stage, "session": ctx.session_id, "sandbox": ctx.sandbox_id, "turn": ctx.turn_id,
                            "step": ctx.step_index, "calls": len(ctx.tool_calls or ())}) + "\\n")


@register_tool_call_hook
class Snapshot(ToolCallHook):
    name = "snapshot"

    async def before_tool_call(self, ctx):
        note("before", ctx)

    async def after_tool_call(self, ctx):
        note("after", ctx)


class Gate(ToolCallHook):
    name = "gate"
    required = True

    async def before_tool_call(self, ctx):
        raise RuntimeError("network rule not applied")
'''


def _tool_call(url: str, sid: str, messages: list, **headers: str) -> httpx.Response:
    tools = [{"type": "function", "function": {"name": "calculator", "description": "evaluate",
                                               "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]
    return httpx.post(url + "/v1/chat/completions", json={"messages": messages, "tools": tools, "max_tokens": 400},
                      headers={"X-Session-Id": sid, **headers}, timeout=30)


def test_tool_call_hooks_run_at_the_step_boundaries_of_a_sandboxed_agent(tmp_path, proxy_stack):
    import json

    from dressage.proxy.config import ToolCallHooksConfig
    from dressage.testing.stack import start_engine

    (tmp_path / "hooks.py").write_text(HOOKS)
    tools_engine = start_engine(tool_call_rate=1.0, mean_response_tokens=20)
    try:
        proxy = proxy_stack(tools_engine.url, tool_call_hooks=ToolCallHooksConfig(
            hooks=(f"{tmp_path / 'hooks.py'}:Snapshot",), before_timeout_s=5.0))
        sandbox = {"X-Dressage-Sandbox-Id": "sbx-1", "X-Turn-Id": "t1"}
        msgs = [{"role": "user", "content": "compute"}]
        first = _tool_call(proxy.url, "hk", msgs, **sandbox).json()
        call = first["choices"][0]["message"]["tool_calls"][0]
        msgs += [first["choices"][0]["message"], {"role": "tool", "tool_call_id": call["id"], "content": "4"}]
        assert _tool_call(proxy.url, "hk", msgs, **sandbox).status_code == 200
        assert _tool_call(proxy.url, "plain", [{"role": "user", "content": "x"}]).status_code == 200  # no sandbox
        log = [json.loads(line) for line in (tmp_path / "hooks.log").read_text().splitlines()]
        assert [(e["stage"], e["step"], e["sandbox"], e["turn"]) for e in log] == \
            [("before", 0, "sbx-1", "t1"), ("after", 1, "sbx-1", "t1"), ("before", 1, "sbx-1", "t1")]
        assert log[0]["calls"] >= 1 and log[0]["session"] == "hk"

        gated = proxy_stack(tools_engine.url,
                            tool_call_hooks=ToolCallHooksConfig(hooks=(f"{tmp_path / 'hooks.py'}:Gate",)))
        refused = _tool_call(gated.url, "g", [{"role": "user", "content": "compute"}], **sandbox)
        assert refused.status_code == 502 and refused.json()["detail"]["error"] == "tool_call_hook_failed"
        assert refused.json()["detail"]["hook"] == "gate"
        assert "g" not in gated.service.core.sessions   # nothing recorded: the failed first call left no session
    finally:
        tools_engine.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_hooks_run_for_a_sandboxed_messages_agent(tmp_path, proxy_stack, stream):
    """A Messages call takes chat's call path whole: a tool result it sends runs the after hooks too."""
    import json

    from dressage.proxy.config import ToolCallHooksConfig
    from dressage.testing.stack import start_engine

    (tmp_path / "hooks.py").write_text(HOOKS)
    tools_engine = start_engine(tool_call_rate=1.0, mean_response_tokens=20)
    try:
        proxy = proxy_stack(tools_engine.url, tool_call_hooks=ToolCallHooksConfig(
            hooks=(f"{tmp_path / 'hooks.py'}:Snapshot",), before_timeout_s=5.0))
        headers = {"X-Session-Id": "hm", "X-Dressage-Sandbox-Id": "sbx-2", "X-Turn-Id": "t1"}
        tools = [{"name": "calculator", "description": "evaluate",
                  "input_schema": {"type": "object", "properties": {"a": {"type": "number"}}}}]
        messages = [{"role": "user", "content": "compute"}]

        def send() -> httpx.Response:
            return httpx.post(proxy.url + "/v1/messages", json={"model": "m", "max_tokens": 400, "tools": tools,
                                                                "messages": messages, "stream": stream},
                              headers=headers, timeout=30)

        first = send()
        assert first.status_code == 200
        if stream:
            final = [json.loads(line[6:]) for line in first.text.splitlines() if line.startswith("data: ")]
            uses = [e["content_block"] for e in final if e["type"] == "content_block_start"
                    and e["content_block"]["type"] == "tool_use"]
        else:
            uses = [b for b in first.json()["content"] if b["type"] == "tool_use"]
        assert uses
        messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": u["id"], "name": u["name"],
                                                        "input": {"a": 1}} for u in uses]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u["id"], "content": "4"}
                                                  for u in uses]}]
        assert send().status_code == 200
        log = [json.loads(line) for line in (tmp_path / "hooks.log").read_text().splitlines()]
        assert [(e["stage"], e["step"], e["sandbox"], e["turn"], e["session"]) for e in log] == \
            [("before", 0, "sbx-2", "t1", "hm"), ("after", 1, "sbx-2", "t1", "hm"), ("before", 1, "sbx-2", "t1", "hm")]
    finally:
        tools_engine.stop()


def test_capabilities_fingerprint_the_chat_template_as_upstream():
    import hashlib

    from dressage.proxy.http.capabilities import template_fingerprint
    from dressage.tokenizer import load_tokenizer

    qwen = load_tokenizer("qwen3")
    assert template_fingerprint(qwen) == hashlib.sha256(qwen.template_source.encode()).hexdigest()
    assert template_fingerprint(load_tokenizer("byte")) is None
