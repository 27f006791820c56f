"""run_generation against a scripted engine: a pause cuts the call, resume continues it as one response."""

import asyncio

import numpy as np
import pytest

from dressage.fields import get_model
from dressage.fields.sglang import encode_routed_experts_b64
from dressage.proxy.engines import generation
from dressage.dataplane import DataPlaneConfig
from dressage.proxy.recording.core import ProxyCore
from dressage.errors import WeightVersionChangedError
from dressage.proxy.engines.generation import GenerationPlan, GenerationResult, run_generation
from dressage.proxy.recording.pause import RolloutPause
from dressage.trajectory import RouteDecision

MODEL = get_model("tiny-moe")


class ScriptedEngine:
    """Answers ``n`` tokens per request; a request in ``hold`` waits for its abort and returns ``cut`` tokens."""

    def __init__(self, n=6, hold=(), cut=2):
        self.n, self.hold, self.cut, self.requests, self._aborts = n, set(hold), cut, [], {}

    def _body(self, input_ids, k, start, finish):
        out = [100 + len(input_ids) + i for i in range(k)]
        rows = len(input_ids) + k - 1 - start
        experts = np.arange(rows * MODEL.num_layers * MODEL.topk).reshape(rows, MODEL.num_layers, MODEL.topk) % 16
        return {"output_ids": out, "meta_info": {
            "finish_reason": finish, "completion_tokens": k,
            "output_token_logprobs": [[-0.5, t, None] for t in out],
            "routed_experts": encode_routed_experts_b64(experts)}}

    async def generate(self, input_ids, sampling, *, rid, routed_experts_start_len=0, **kw):
        self.requests.append((rid, len(input_ids), routed_experts_start_len, sampling["max_new_tokens"]))
        if len(self.requests) in self.hold:
            ev = self._aborts.setdefault(rid, asyncio.Event())
            await ev.wait()
            return self._body(input_ids, self.cut, routed_experts_start_len, {"type": "abort"})
        k = min(self.n, sampling["max_new_tokens"])
        return self._body(input_ids, k, routed_experts_start_len, {"type": "length" if k < self.n else "stop"})

    async def abort(self, rid):
        self._aborts.setdefault(rid, asyncio.Event()).set()


def _plan(engine, prompt_len=5, start=0, max_new=6):
    core = ProxyCore(DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True))
    decision = RouteDecision("create", None, start)
    plan = GenerationPlan("rid", np.arange(1, prompt_len + 1, dtype=np.int32), decision,
                          {"max_new_tokens": max_new}, engine, core.generate_params(decision))
    return plan, core


async def _run(plan, core, pause, partial=True):
    events = []
    async for ev in run_generation(plan, pause, core.normalize, partial_rollout=partial, timeout_s=5,
                                   decode=lambda ids: "".join(chr(97 + i % 26) for i in ids)):
        events.append(ev)
    return events


def test_paused_call_resumes_as_one_response_with_per_token_versions_and_contiguous_r3():
    async def scenario():
        engine = ScriptedEngine(n=6, hold={1}, cut=2)
        plan, core = _plan(engine, prompt_len=5, start=0, max_new=6)
        pause = RolloutPause()
        task = asyncio.ensure_future(_run(plan, core, pause))
        await asyncio.sleep(0.01)
        await pause.pause()
        pause.resume(3)
        (result,) = await task
        return engine, result

    engine, result = asyncio.run(scenario())
    assert isinstance(result, GenerationResult) and result.chunks == 2
    # The resumed request: prompt + 2 cut tokens, 4 tokens left, routing from the last held row.
    assert engine.requests[1] == ("rid_r001", 7, 6, 4)
    assert result.token_versions.tolist() == [0, 0, 3, 3, 3, 3]
    assert len(result.response_ids) == 6 and result.logprobs.shape == (6,)
    assert result.routed_experts.shape[0] == 5 + 6 - 1            # rows [0, T-1) with no gap
    assert result.finish_reason == "length"                     # the resumed request ran out of budget


def test_paused_call_without_partial_rollout_is_rejected():
    async def scenario():
        engine = ScriptedEngine(hold={1})
        plan, core = _plan(engine)
        pause = RolloutPause()
        task = asyncio.ensure_future(_run(plan, core, pause, partial=False))
        await asyncio.sleep(0.01)
        await pause.pause()
        with pytest.raises(WeightVersionChangedError, match="partial rollout is off"):
            await task

    asyncio.run(scenario())


def test_streamed_call_waiting_for_resume_sends_keepalives(monkeypatch):
    monkeypatch.setattr(generation, "KEEPALIVE_S", 0.01)

    class StreamEngine(ScriptedEngine):
        async def generate_stream(self, input_ids, sampling, *, rid, **kw):
            yield await self.generate(input_ids, sampling, rid=rid, **kw)

    async def scenario():
        plan, core = _plan(StreamEngine())
        plan.stream = True
        pause = RolloutPause()
        await pause.pause()
        task = asyncio.ensure_future(_run(plan, core, pause))
        await asyncio.sleep(0.05)
        pause.resume()
        return await task

    events = asyncio.run(scenario())
    assert events.count(None) >= 2 and isinstance(events[-1], GenerationResult)
    assert len(events[-2]) == 6                      # the streamed text of all six tokens


@pytest.mark.parametrize("step", [1, 3, 8])
def test_incremental_text_matches_a_full_decode(step):
    from dressage.tokenizer import load_tokenizer

    tok = load_tokenizer("byte")
    ids = tok.encode("héllo wörld \N{GRINNING FACE} and more ünïcödé <tool_call>") + [tok.im_end_token_id]
    decode = lambda xs: tok.decode(xs, skip_special_tokens=True)  # noqa: E731
    inc = generation._IncrementalText(decode)
    for end in range(step, len(ids) + step, step):
        partial = inc.extend_to(ids[:end])
        assert decode(ids[:end]).startswith(partial) and "\ufffd" not in partial
    assert inc.text == decode(ids)


@pytest.mark.parametrize("stream", [False, True])
def test_the_engine_body_is_dropped_once_decoded(stream):
    """While the caller commits the result, the generator holds the decoded arrays, not the JSON body."""

    class Streaming(ScriptedEngine):
        async def generate_stream(self, input_ids, sampling, *, rid, **kw):
            yield await self.generate(input_ids, sampling, rid=rid, **kw)

    async def scenario():
        engine = Streaming(n=4)
        plan, core = _plan(engine, max_new=4)
        plan.stream = stream
        gen = run_generation(plan, RolloutPause(), core.normalize, partial_rollout=True, timeout_s=5,
                             decode=lambda ids: "x" * len(ids))
        async for ev in gen:
            if isinstance(ev, GenerationResult):
                held = dict(gen.ag_frame.f_locals)  # suspended at the yield: what it keeps alive now
                break
        await gen.aclose()
        return ev, held

    result, held = asyncio.run(scenario())
    assert result.routed_experts.shape == (5 + 4 - 1, MODEL.num_layers, MODEL.topk)
    assert held["body"] is None and held["out"] is None and held.get("answer") is None
    assert not any(isinstance(v, dict) and "meta_info" in v for v in held.values())  # no engine body by any name
