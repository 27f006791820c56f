"""The Proxy against SGLang's real answers: weight_version, queued aborts, prefix aborts, model shape.

Fixtures in tests/fixtures/sglang are the wire shapes of SGLang 0.5.x (see docs/compat-facts.md).
"""

from __future__ import annotations

import asyncio
import json
import pathlib

import numpy as np
import pytest

from dressage.errors import ConfigError, FieldShapeError
from dressage.fields import NAMED_BASE, VersionTable, decode_generate_response, get_model
from dressage.fields.sglang import encode_routed_experts_b64, is_queued_abort
from dressage.proxy.config import DataPlaneConfig
from dressage.proxy.recording.core import ProxyCore
from dressage.proxy.engines.generation import GenerationPlan, GenerationResult, _StreamedAnswer, run_generation
from dressage.proxy.engines.model_shape import discover_model_spec, read_model_config, resolve_tokenizer
from dressage.proxy.recording.pause import RolloutPause
from dressage.proxy.engines.rids import RID_LENGTH, RidFactory, chunk_rid
from dressage.trajectory import RouteDecision

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "sglang"
MODEL = get_model("tiny-moe")


def fixture(name: str) -> dict:
    body = json.loads((FIXTURES / name).read_text())
    body.pop("_shape", None)
    return body


# --------------------------------------------------------------------------- decoding

def test_finished_answer_carries_the_engine_weight_version():
    out = decode_generate_response(fixture("generate_finished.json"), prompt_len=4)
    assert out.weight_version == "step-7" and out.finish_reason == "stop"
    assert out.output_ids.tolist() == [1010, 1011, 1012] and not out.aborted


@pytest.mark.parametrize("name, dropped", [("generate_queued_abort.json", 0), ("generate_requeued_abort.json", 2)])
def test_queued_abort_with_r3_is_a_cut_that_keeps_nothing(name, dropped):
    body = fixture(name)
    assert is_queued_abort(body["meta_info"]) and "routed_experts" not in body["meta_info"]
    out = decode_generate_response(body, prompt_len=4, num_layers=2, topk=2, want_routed_experts=True)
    assert out.aborted and len(out.output_ids) == 0 and out.routed_experts is None
    assert out.dropped_tokens == dropped and out.weight_version == "step-7"


def test_queued_abort_without_r3_keeps_its_scored_tokens():
    out = decode_generate_response(fixture("generate_requeued_abort.json"), prompt_len=4)
    assert out.aborted and out.output_ids.tolist() == [1010, 1011]
    assert out.logprobs.tolist() == [-0.25, -0.5] and out.dropped_tokens == 0


def test_a_finished_answer_without_routing_is_still_an_error_with_r3_on():
    with pytest.raises(Exception, match="routed_experts missing"):
        decode_generate_response(fixture("generate_finished.json"), prompt_len=4, num_layers=2, topk=2,
                                 want_routed_experts=True)


def test_streamed_queued_abort_last_chunk_does_not_repeat_the_last_id():
    answer = _StreamedAnswer()
    for ids in ([1010], [1010, 1011]):  # cumulative chunks, SGLang's default streaming
        answer.add({"output_ids": ids, "meta_info": {"finish_reason": None, "completion_tokens": len(ids),
                                                       "output_token_logprobs": [[-0.1, t, None] for t in ids]}})
    answer.add(fixture("stream_queued_abort_last_chunk.json"))
    body = answer.body()
    assert body["output_ids"] == [1010, 1011]
    assert [e[1] for e in body["meta_info"]["output_token_logprobs"]] == [1010, 1011]
    assert body["meta_info"]["finish_reason"]["type"] == "abort"


def test_streamed_queued_abort_with_a_count_that_does_not_add_up_keeps_nothing():
    answer = _StreamedAnswer()
    answer.add({"output_ids": [1010], "meta_info": {"finish_reason": None, "completion_tokens": 1,
                                                    "output_token_logprobs": [[-0.1, 1010, None]]}})
    answer.add(fixture("stream_queued_abort_last_chunk.json"))  # says 2 tokens; we saw 1
    assert answer.body()["output_ids"] == []


# --------------------------------------------------------------------------- generation

class QueueAbortEngine:
    """Request 1 waits in the 'queue' until aborted and answers SGLang's queued-abort shape;
    later requests finish with ``weight_version`` = the engine's current version."""

    def __init__(self, version="step-7"):
        self.version, self.requests, self.routing_keys, self._abort = version, [], [], asyncio.Event()

    async def generate(self, input_ids, sampling, *, rid, routed_experts_start_len=0, routing_key=None, **kw):
        self.requests.append((rid, len(input_ids), routed_experts_start_len))
        self.routing_keys.append(routing_key)
        if len(self.requests) == 1:
            await self._abort.wait()
            body = fixture("generate_requeued_abort.json")
            body["meta_info"]["weight_version"] = self.version
            return body
        k = sampling["max_new_tokens"]
        out = [200 + i for i in range(k)]
        rows = len(input_ids) + k - 1 - routed_experts_start_len
        experts = (np.arange(rows * MODEL.num_layers * MODEL.topk) % 16).reshape(rows, MODEL.num_layers, MODEL.topk)
        return {"output_ids": out, "meta_info": {
            "id": rid, "finish_reason": {"type": "length"}, "prompt_tokens": len(input_ids),
            "weight_version": self.version, "completion_tokens": k,
            "output_token_logprobs": [[-0.5, t, None] for t in out],
            "routed_experts": encode_routed_experts_b64(experts)}}

    async def abort(self, rid):
        self._abort.set()


def test_queued_abort_under_r3_and_partial_rollout_resumes_and_stamps_engine_versions():
    async def scenario():
        engine = QueueAbortEngine()
        core = ProxyCore(DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True))
        decision = RouteDecision("create", None, 0)
        plan = GenerationPlan(RidFactory("abc123").call("sess-1"), np.arange(1, 6, dtype=np.int32), decision,
                              {"max_new_tokens": 4}, engine, core.generate_params(decision), routing_key="sess-1")
        pause = RolloutPause(0)
        events = []

        async def consume():
            async for ev in run_generation(plan, pause, core.normalize, partial_rollout=True, timeout_s=5,
                                           decode=lambda ids: ""):
                events.append(ev)

        task = asyncio.ensure_future(consume())
        while not engine.requests:
            await asyncio.sleep(0)
        await pause.pause()
        engine.version = "step-8"  # the trainer pushed new weights and set the engine's version
        pause.resume()
        await task
        return engine, pause, events[-1]

    engine, pause, result = asyncio.run(scenario())
    assert isinstance(result, GenerationResult) and result.chunks == 2 and result.dropped_tokens == 2
    # Nothing of the cut was kept: the resumed request re-sends the bare prompt from row 0.
    assert [(n, start) for _, n, start in engine.requests] == [(5, 0), (5, 0)]
    assert result.response_ids.tolist() == [200, 201, 202, 203]
    step8 = pause.versions.table.code("step-8")
    assert result.token_versions.tolist() == [step8] * 4 and pause.weight_version == step8
    assert pause.versions.table.label(step8) == "step-8" and step8 >= NAMED_BASE
    assert engine.routing_keys == ["sess-1", "sess-1"]
    rids = [r for r, _, _ in engine.requests]
    assert rids[0] != rids[1] and not rids[1].startswith(rids[0]) and len(set(map(len, rids))) == 1


def test_the_engine_default_version_falls_back_to_the_proxy_counter():
    versions = RolloutPause(3).versions
    assert versions.stamp("default", 3) == 3 and versions.stamp(None, 3) == 3 and versions.current == 3
    assert versions.from_engine == 0
    assert versions.stamp("12", 3) == 12 and versions.current == 12 and versions.from_engine == 1


def test_resume_takes_the_engine_version_string():
    pause = RolloutPause(0)
    out = pause.resume("policy-v2")
    assert out["version"] == "policy-v2" and out["weight_version"] == pause.versions.table.code("policy-v2")
    assert pause.resume(5)["version"] == "5"


def test_version_table_numbers_stay_numbers_and_names_get_stable_codes():
    t = VersionTable()
    assert t.code("7") == 7 and t.code(9) == 9 and t.label(7) == "7"
    a, b = t.code("default"), t.code("rl-step-3")
    assert a == NAMED_BASE and b == NAMED_BASE + 1 and t.code("default") == a and t.label(b) == "rl-step-3"
    for bad in ("", "  ", True, 1.5, -1):
        with pytest.raises(ConfigError):
            t.code(bad)


# --------------------------------------------------------------------------- rids

def test_rids_are_never_prefixes_of_one_another():
    f1, f2 = RidFactory("aaaaaa"), RidFactory("bbbbbb")
    rids = set()
    for sid in ("s", "s1", "s-1", "x" * 300):
        for _ in range(12):  # call 1 vs call 10, 11
            base = f1.call(sid)
            rids.update(chunk_rid(base, c) for c in (0, 1, 10, 11))
        rids.add(f2.call(sid))
    assert all(len(r) == RID_LENGTH for r in rids)
    ordered = sorted(rids)
    assert all(not b.startswith(a) for a, b in zip(ordered, ordered[1:]))  # sorted: a prefix sits just before
    assert f1.call("s").startswith(f1.session_key("s")) and not f1.call("s1").startswith(f1.session_key("s"))


def test_foreign_rids_get_a_fixed_width_chunk_suffix():
    assert [chunk_rid("abc", c) for c in (0, 1, 12)] == ["abc_r000", "abc_r001", "abc_r012"]
    with pytest.raises(ConfigError):
        chunk_rid("abc", 1000)
    with pytest.raises(ConfigError):
        RidFactory("XYZ")


# --------------------------------------------------------------------------- model shape

def test_glm_shape_from_config_counts_every_hidden_layer():
    spec, source = discover_model_spec(fixture("model_info.json"), config=fixture("glm_config.json"))
    assert (spec.num_layers, spec.topk, spec.num_experts, spec.vocab_size) == (78, 8, 256, 154_880)
    assert source.to_dict() == {"num_layers": "config.json", "topk": "config.json", "num_experts": "config.json"}
    glm = get_model("glm-5.2-744b-a40b")
    assert glm.num_layers == 75 and glm.hidden_layers == spec.num_layers == 78


def test_config_json_is_read_from_the_engine_model_path(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(fixture("qwen_moe_config.json")))
    info = dict(fixture("model_info.json"), model_path=str(tmp_path))
    assert read_model_config(str(tmp_path))["num_experts"] == 128
    spec, _ = discover_model_spec(info)
    assert (spec.num_layers, spec.topk, spec.num_experts) == (48, 8, 128)


def test_overrides_win_and_unknown_shapes_are_refused():
    spec, source = discover_model_spec(fixture("model_info.json"), config=fixture("glm_config.json"), num_layers=75)
    assert spec.num_layers == 75 and source.num_layers == "override" and source.topk == "config.json"
    with pytest.raises(ConfigError, match="num_layers is unknown"):
        discover_model_spec(fixture("model_info.json"), config={})
    spec, source = discover_model_spec(fixture("model_info.json"), config={}, preset=get_model("glm-5.2-744b-a40b"))
    assert spec.num_layers == 78 and source.num_layers == "preset"
    with pytest.raises(ConfigError, match="positive"):
        discover_model_spec({}, config={}, num_layers=0, topk=1, num_experts=2)


def test_engine_reported_shape_is_used_before_config():
    info = {"model_path": "tiny", "tokenizer_path": "byte", "num_hidden_layers": 4, "num_experts_per_tok": 2,
            "num_experts": 16}
    spec, source = discover_model_spec(info, config=fixture("glm_config.json"))
    assert (spec.num_layers, spec.topk, spec.num_experts) == (4, 2, 16) and source.num_layers == "engine"


def test_a_wrong_layer_count_fails_loudly_on_real_rows():
    rows = 4 + 3 - 1
    body = fixture("generate_finished.json")
    body["meta_info"]["routed_experts"] = encode_routed_experts_b64(np.zeros((rows, 78, 8), dtype=np.int32))
    assert decode_generate_response(body, prompt_len=4, num_layers=78, topk=8,
                                    want_routed_experts=True).routed_experts.shape == (rows, 78, 8)
    with pytest.raises(FieldShapeError):
        decode_generate_response(body, prompt_len=4, num_layers=75, topk=8, want_routed_experts=True)


# --------------------------------------------------------------------------- tokenizer check

def test_byte_tokenizer_against_a_real_model_refuses_to_start():
    info = dict(fixture("model_info.json"), model_path="/models/glm", tokenizer_path="/models/glm")
    with pytest.raises(ConfigError, match="--tokenizer"):
        resolve_tokenizer("byte", info)
    with pytest.raises(ConfigError):
        resolve_tokenizer(None, info)
    assert resolve_tokenizer("byte", info, from_engine=True) == "/models/glm"
    assert resolve_tokenizer("/tok", info) == "/tok"
    assert resolve_tokenizer("byte", {"model_path": "tiny", "tokenizer_path": "byte"}) == "byte"
