"""slime's rollout function running the user's own agent, one Proxy session per Sample, against a real
Proxy and the built-in engine: slime-shaped groups, TQ on == off, no TQ key left, retries, replacements."""

from __future__ import annotations

import json
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import openai
import pytest
import torch

from dressage.agents import CommandAgent
from dressage.errors import AgentCommandError, ConfigError, TrajectoryError
from dressage.fields import get_model
from dressage.harness.agents.config import AgentConfig
from dressage.integrations import slime_rollout
from dressage.integrations.slime import SlimeSample
from dressage.integrations.slime_config import TRAIN_ENTRY_MARK, TRAINER_CONVERSION
from dressage.integrations.slime_rollout import SlimeRollout
from dressage.testing.stack import start_proxy

from slime_standins import (MegatronActorStandIn, assert_same, flatten_like_slime, interleaved, rank_data,
                            split_like_slime, train_ranks)

MODEL = get_model("tiny-moe")
ENGINE = {"seed": 5, "mean_response_tokens": 10, "tool_call_rate": 0.5}

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]


class DataSource:
    """slime's data source contract: ``get_samples(n)`` -> n groups of ``per_group`` Samples, indexed 0.. in
    order of handing out, with the data source's own label, metadata and group index."""

    def __init__(self, prompts, per_group=2, metadata=None, indexed=True):
        self.prompts, self.per_group, self.metadata = list(prompts), per_group, metadata or {}
        self.indexed = indexed  # False: Samples without an index, as some data sources hand them out
        self.calls, self.next_group, self.next_index = [], 0, 0

    def get_samples(self, n):
        self.calls.append(n)
        out = []
        for _ in range(n):
            g = self.next_group
            prompt = self.prompts[g % len(self.prompts)]
            group = []
            for _ in range(self.per_group):
                meta = {"task": f"task-{g}", "difficulty": g % 3, **self.metadata.get(prompt, {})}
                group.append(SlimeSample(group_index=100 + g, index=self.next_index if self.indexed else None,
                                         prompt=prompt, label={"answer": g}, metadata=meta))
                self.next_index += 1
            self.next_group += 1
            out.append(group)
        return out


def trainer_marks():
    """What slime's args carry under ``python -m dressage.integrations.slime_train`` with Dressage's conversion."""
    return {"custom_convert_samples_to_train_data_path": TRAINER_CONVERSION, TRAIN_ENTRY_MARK: True}


def slime_args(batch=2, **over):
    return SimpleNamespace(**{"rollout_batch_size": batch, "n_samples_per_prompt": 2, "reward_key": None,
                              "dynamic_sampling_filter_path": None, "rollout_top_p": 1.0, "rollout_temperature": 1.0,
                              **over})


async def tool_agent(ctx):
    """A user's agent: the official openai client on the session's base URL, a multi-turn tool loop. A
    Sample whose metadata says ``compress`` rewrites its history once (the Proxy starts a new Segment)."""
    client = openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0, timeout=60)
    index = ctx.index or 0  # a data source may hand out Samples without an index
    messages = [{"role": "system", "content": "You are a careful calculator agent."},
                {"role": "user", "content": ctx.prompt}]
    try:
        for turn in range(4):
            reply = await client.chat.completions.create(
                model=ctx.model, messages=messages, tools=TOOLS, max_tokens=12, temperature=1.0,
                seed=1000 * index + turn)
            msg = reply.choices[0].message
            assistant = {"role": "assistant", "content": msg.content}
            if msg.tool_calls:
                assistant["tool_calls"] = [c.model_dump(exclude_none=True) for c in msg.tool_calls]
            messages.append(assistant)
            for call in msg.tool_calls or []:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
            if not msg.tool_calls:
                messages.append({"role": "user", "content": "Go on."})
            if ctx.metadata.get("compress") and turn == 1:
                messages = [messages[0], {"role": "user", "content": f"Summary: two turns on {ctx.prompt!r}."}]
    finally:
        await client.close()
    return float(index % 3) / 2


def sessions_of(groups):
    return [sess for g in groups for sess in g]


def test_a_users_openai_agent_yields_complete_slime_groups_with_the_data_sources_fields(engine):
    with start_proxy(engine.url) as proxy:
        source = DataSource(["Add 2 and 3.", "Multiply 4 by 5."], metadata={"Multiply 4 by 5.": {"compress": True}})
        rollout = SlimeRollout(proxy_url=proxy.url, agent=tool_agent, concurrency=3)
        slime_rollout.install(rollout)
        try:
            out = slime_rollout.generate_rollout(slime_args(), 7, source)
        finally:
            slime_rollout.install(None)
        groups = out.samples
        assert source.calls == [2] and len(groups) == 2 and [len(g) for g in groups] == [2, 2]
        assert not proxy.service.trajectories.finalized   # read and handed over: nothing waits in the Proxy
        for g, group in enumerate(groups):
            for s, segments in enumerate(group):
                assert isinstance(segments, list) and segments
                sids = {seg.metadata["session_id"] for seg in segments}
                assert len(sids) == 1
                for k, seg in enumerate(segments):
                    assert type(seg) is SlimeSample
                    assert seg.group_index == 100 + g and seg.index == 2 * g + s and seg.rollout_id == seg.index
                    assert seg.label == {"answer": g} and seg.prompt == source.prompts[g]
                    assert seg.metadata["task"] == f"task-{g}" and seg.metadata["difficulty"] == g % 3
                    assert seg.metadata["segment_index"] == k and seg.metadata["segment_count"] == len(segments)
                    assert seg.reward == float(seg.index % 3) / 2
                    assert len(seg.loss_mask) == seg.response_length == len(seg.rollout_log_probs) > 0
                    r3 = seg.rollout_routed_experts
                    assert r3.dtype == np.int32 and r3.shape == (len(seg.tokens) - 1, MODEL.num_layers, MODEL.topk)
                    assert r3.flags.writeable  # as under TQ: slime's conversion (and a user's hook) may write it
                    assert seg.status.name == "COMPLETED" and seg.weight_versions
        counts = {g: [len(sess) for sess in group] for g, group in enumerate(groups)}
        assert counts[0] == [1, 1] and counts[1] == [2, 2]   # the compressing sessions: two Segments each
        assert out.metrics["dressage/segments_per_session_max"] == 2
        assert out.metrics["dressage/segments_per_session_mean"] == 1.5
        assert out.metrics["dressage/sessions_failed"] == out.metrics["dressage/groups_replaced"] == 0
        assert out.metrics["dressage/tq_bytes_restored"] == 0   # TQ off: every field came in the read


def _fields(groups):
    return [[(seg.tokens, seg.loss_mask, seg.rollout_log_probs, seg.rollout_routed_experts.tolist(), seg.reward)
             for seg in sess] for sess in sessions_of(groups)]


def test_sessions_of_samples_without_an_index_each_get_a_rollout_id_of_their_own(engine):
    # All four sessions are created before any finishes (concurrency 4): they finish together.
    source = DataSource(["Add 2 and 3.", "Multiply 4 by 5."], metadata={"Multiply 4 by 5.": {"compress": True}},
                        indexed=False)
    with start_proxy(engine.url) as proxy:
        out = SlimeRollout(proxy_url=proxy.url, agent=tool_agent, concurrency=4)(slime_args(), 0, source)
    sessions = sessions_of(out.samples)
    assert len(sessions) == 4 and any(len(sess) > 1 for sess in sessions)
    ids = [{seg.rollout_id for seg in sess} for sess in sessions]
    assert all(len(i) == 1 for i in ids)  # a session's Segments are one rollout
    ids = [i.pop() for i in ids]
    assert sorted(ids) == [-4, -3, -2, -1]  # one id per session, none an index a data source hands out
    assert all(seg.index is None for sess in sessions for seg in sess)


def test_tq_on_and_off_give_the_same_samples_and_no_key_outlives_a_rollout(engine):
    from dressage.tq import TransferQueue

    results = {}
    for with_tq in (False, True):
        tq = TransferQueue.start({"deployment": "local", "num_storage_units": 1, "retention_s": None}) \
            if with_tq else None
        try:
            with start_proxy(engine.url, tq=tq, routed_experts_dtype="uint8") as proxy:
                rollout = SlimeRollout(proxy_url=proxy.url, agent=tool_agent, concurrency=4)
                runs = []
                for rollout_id in range(2):
                    source = DataSource(["Add 2 and 3.", "Multiply 4 by 5."],
                                        metadata={"Multiply 4 by 5.": {"compress": True}})
                    out = rollout(slime_args(), rollout_id, source)
                    runs.append(_fields(out.samples))
                    if with_tq:
                        assert tq.client().total_keys() == 0   # restored and released by the rollout
                        assert out.metrics["dressage/tq_bytes_restored"] > 0
                results[with_tq] = runs
        finally:
            if tq is not None:
                tq.shutdown()
    assert results[False] == results[True]
    assert results[False][0] == results[False][1]   # the agent seeds its calls: the same rollout replays


def test_a_failing_session_is_retried_and_an_always_failing_group_is_replaced(engine):
    tries: dict[int, int] = {}

    async def flaky(ctx):
        tries[ctx.index] = tries.get(ctx.index, 0) + 1
        if ctx.prompt == "poison":
            raise RuntimeError("this prompt always breaks the agent")
        if ctx.index == 1 and tries[ctx.index] == 1:
            raise RuntimeError("first try fails")
        return await tool_agent(ctx)

    with start_proxy(engine.url) as proxy:
        source = DataSource(["Add 2 and 3.", "poison", "Name a colour."])
        rollout = SlimeRollout(proxy_url=proxy.url, agent=flaky, concurrency=4, session_retries=1)
        out = rollout(slime_args(), 0, source)
        groups = out.samples
        assert source.calls == [2, 1]   # one replacement group drawn
        assert [sess[0].prompt for g in groups for sess in g] == ["Add 2 and 3."] * 2 + ["Name a colour."] * 2
        assert tries[1] == 2 and tries[2] == tries[3] == 2   # retried once; both poison Samples tried twice
        assert out.metrics["dressage/groups_replaced"] == 1
        assert out.metrics["dressage/sessions_failed"] == 5   # 1 + 2 x 2
        stats = proxy.service.stats()
        assert stats["sessions"]["active"] == 0 and stats["unread_trajectories"] == 0

        # No replacement left: the rollout fails and leaves nothing behind in the Proxy.
        rollout = SlimeRollout(proxy_url=proxy.url, agent=flaky, concurrency=4, session_retries=0,
                               max_group_replacements=0)
        with pytest.raises(TrajectoryError, match="1 groups failed and 0 were filtered, more than the 0 "
                                                  "replacements allowed"):
            rollout(slime_args(), 1, DataSource(["Add 2 and 3.", "poison"]))
        stats = proxy.service.stats()
        assert stats["sessions"]["active"] == 0 and stats["unread_trajectories"] == 0


def test_agent_mistakes_are_named_and_leave_nothing_behind(engine):
    def sync_agent(ctx):  # not async: every session would fail the same way
        return 1.0

    async def numpy_reward(ctx):  # a numpy scalar is a number
        await tool_agent(ctx)
        return np.float32(0.5)

    async def no_call(ctx):  # returns without one model call: nothing to train on
        return 1.0

    with start_proxy(engine.url) as proxy:
        rollout = SlimeRollout(proxy_url=proxy.url, agent=sync_agent, max_group_replacements=3)
        with pytest.raises(ConfigError, match="must be an async function.*returned float"):
            rollout(slime_args(batch=1), 0, DataSource(["Add 2 and 3."]))
        out = SlimeRollout(proxy_url=proxy.url, agent=numpy_reward)(slime_args(batch=1), 1,
                                                                     DataSource(["Add 2 and 3."]))
        assert [sess[0].reward for g in out.samples for sess in g] == [0.5, 0.5]
        rollout = SlimeRollout(proxy_url=proxy.url, agent=no_call, session_retries=0, max_group_replacements=0)
        with pytest.raises(TrajectoryError, match="returned without calling the Proxy"):
            rollout(slime_args(batch=1), 2, DataSource(["Add 2 and 3."]))
        stats = proxy.service.stats()
        assert stats["sessions"]["active"] == 0


def drop_first_group(args, samples):
    """A dynamic sampling filter: drops the groups whose Samples have an even group index."""
    return SimpleNamespace(keep=samples[0].group_index % 2 == 1, reason="even")


def test_a_group_the_dynamic_filter_drops_is_replaced(engine):
    with start_proxy(engine.url) as proxy:
        source = DataSource(["Add 2 and 3.", "Name a colour.", "Add 1 and 1.", "Name a fruit."])
        rollout = SlimeRollout(proxy_url=proxy.url, agent=tool_agent, concurrency=4)
        out = rollout(slime_args(dynamic_sampling_filter_path=f"{__name__}:drop_first_group"), 0, source)
        assert [g[0][0].group_index for g in out.samples] == [103, 101]   # the slot of 100 refilled by 103
        assert out.metrics["dressage/groups_filtered"] == 2 and out.metrics["dressage/groups_replaced"] == 2
        assert proxy.service.stats()["unread_trajectories"] == 0


def drop_first_group_as_slime_does(args, samples):
    """As slime's own ``check_reward_nonzero_std``: ``keep`` a 0-d torch bool tensor."""
    torch = pytest.importorskip("torch")
    return SimpleNamespace(keep=torch.tensor(samples[0].group_index % 2 == 1), reason=None)


def test_a_filter_keeping_with_a_one_value_tensor_as_slimes_own_is_honoured(engine):
    from dressage.integrations.slime_rollout import _keeps

    with start_proxy(engine.url) as proxy:
        source = DataSource(["Add 2 and 3.", "Name a colour.", "Add 1 and 1.", "Name a fruit."])
        rollout = SlimeRollout(proxy_url=proxy.url, agent=tool_agent, concurrency=4)
        out = rollout(slime_args(dynamic_sampling_filter_path=f"{__name__}:drop_first_group_as_slime_does"), 0,
                      source)
        assert [g[0][0].group_index for g in out.samples] == [103, 101]
        assert proxy.service.stats()["unread_trajectories"] == 0
    assert _keeps(np.array(True)) is True and _keeps(SimpleNamespace(keep=np.bool_(False))) is False
    for bad in ("yes", None, np.array([True, False]), [True]):
        with pytest.raises(ConfigError, match="dynamic_sampling_filter_path"):
            _keeps(SimpleNamespace(keep=bad))


CHAT_SCRIPT = textwrap.dedent("""
    import json, os, urllib.request
    prompt = json.load(open(os.environ["DRESSAGE_PROMPT_FILE"]))["prompt"]
    body = {"model": os.environ["OPENAI_MODEL"], "max_tokens": 8,
            "messages": [{"role": "user", "content": prompt}]}
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    reply = json.load(urllib.request.urlopen(req, timeout=60))
    tokens = reply["usage"]["completion_tokens"]
    json.dump({"score": 1.0 if tokens > 0 else 0.0, "tokens": tokens}, open(os.environ["DRESSAGE_REWARD_FILE"], "w"))
""")


def test_a_command_agent_calls_the_proxy_and_reports_its_reward_through_the_file(engine, tmp_path):
    with start_proxy(engine.url) as proxy:
        agent = CommandAgent([sys.executable, "-c", CHAT_SCRIPT], cwd=tmp_path)
        rollout = SlimeRollout(proxy_url=proxy.url, agent=agent, concurrency=2)
        out = rollout(slime_args(reward_key="score"), 0, DataSource(["Add 2 and 3.", "Name a colour."]))
        segments = [seg for sess in sessions_of(out.samples) for seg in sess]
        assert len(segments) == 4
        for seg in segments:
            assert seg.reward["score"] == 1.0 and seg.reward["tokens"] == seg.response_length
        assert list(tmp_path.iterdir()) == []   # every session's directory removed

        # A dict reward without --reward-key is a configuration error, and nothing stays in the Proxy.
        with pytest.raises(ConfigError, match="--reward-key"):
            rollout(slime_args(), 1, DataSource(["Add 2 and 3."]))
        assert proxy.service.stats()["sessions"]["active"] == 0

        # A command that outlives its time-out is killed; the session fails (here, with nothing to replace it).
        slow = CommandAgent([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1.0)
        rollout = SlimeRollout(proxy_url=proxy.url, agent=slow, session_retries=0, max_group_replacements=0)
        with pytest.raises(TrajectoryError) as info:
            rollout(slime_args(batch=1), 2, DataSource(["Add 2 and 3."]))
        causes, exc = [], info.value
        while exc is not None:
            causes.append(exc)
            exc = exc.__cause__
        assert isinstance(causes[-1], AgentCommandError)   # the agent's own error ends the chain
        assert "killed after 1 s" in str(info.value)
        stats = proxy.service.stats()
        assert stats["sessions"]["active"] == 0 and stats["unread_trajectories"] == 0


def test_evaluation_returns_slimes_eval_data_and_trains_on_nothing(engine, tmp_path):
    from dressage.tq import TransferQueue

    path = tmp_path / "eval.jsonl"
    path.write_text("\n".join(json.dumps({"input": p, "answer": i}) for i, p in enumerate(["Add 1 and 2.", "Hi."])))
    tq = TransferQueue.start({"deployment": "local", "num_storage_units": 1, "retention_s": None})
    try:
        with start_proxy(engine.url, tq=tq) as proxy:
            source = DataSource(["never used"])
            rollout = SlimeRollout(proxy_url=proxy.url, agent=tool_agent, concurrency=4)
            args = slime_args(eval_datasets=[{"name": "math", "path": str(path), "label_key": "answer",
                                              "n_samples_per_eval_prompt": 2}])
            out = rollout(args, 3, source, evaluation=True)
            data = out.data["math"]
            assert [s.prompt for s in data["samples"]] == ["Add 1 and 2."] * 2 + ["Hi."] * 2
            assert [s.label for s in data["samples"]] == [0, 0, 1, 1]
            assert data["rewards"] == [float(i % 3) / 2 for i in range(4)] and data["truncated"] == [False] * 4
            assert source.calls == [] and tq.client().total_keys() == 0
            stats = proxy.service.stats()
            assert stats["sessions"]["active"] == 0 and stats["unread_trajectories"] == 0
    finally:
        tq.shutdown()


def test_evaluation_sessions_get_each_datasets_sampling_settings_as_slime_resolves_them(engine, tmp_path):
    seen: dict[str, dict] = {}

    async def recording_agent(ctx):
        seen[f"{'eval' if ctx.evaluation else 'train'}:{ctx.prompt}"] = dict(ctx.sampling_params)
        client = openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0, timeout=60)
        await client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": ctx.prompt}],
                                             max_tokens=ctx.sampling_params["max_new_tokens"] or 4,
                                             temperature=ctx.sampling_params["temperature"])
        return 1.0

    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"question": f"from {name}"}))
    args = slime_args(batch=1, n_samples_per_prompt=1, rollout_temperature=1.0, rollout_top_k=5,
                      rollout_max_response_len=16, eval_temperature=0.6, eval_max_response_len=4,
                      eval_input_key="question", n_samples_per_eval_prompt=1,
                      eval_datasets=[{"name": "a", "path": str(tmp_path / "a.jsonl"), "temperature": 0.3,
                                      "stop": ["###"]},
                                     {"name": "b", "path": str(tmp_path / "b.jsonl")}])
    with start_proxy(engine.url) as proxy:
        rollout = SlimeRollout(proxy_url=proxy.url, agent=recording_agent)
        rollout(args, 1, DataSource(["Add 2 and 3."]), evaluation=True)
        rollout(args, 1, DataSource(["Add 2 and 3."]))
    # the entry's own setting, else --eval-*, else the rollout's
    assert seen["eval:from a"] == {"temperature": 0.3, "top_p": 1.0, "top_k": 5, "max_new_tokens": 4,
                                   "stop": ["###"], "stop_token_ids": None}
    assert seen["eval:from b"] == {**seen["eval:from a"], "temperature": 0.6, "stop": None}
    assert seen["train:Add 2 and 3."] == {"temperature": 1.0, "top_p": 1.0, "top_k": 5, "max_new_tokens": 16,
                                          "stop": None, "stop_token_ids": None}


def test_the_rollout_function_also_runs_where_an_event_loop_is_running(engine):
    import asyncio

    async def caller(url):   # slime's own rollout code calls from inside a running loop
        return SlimeRollout(proxy_url=url, agent=tool_agent)(slime_args(batch=1), 0, DataSource(["Add 2 and 3."]))

    with start_proxy(engine.url) as proxy:
        out = asyncio.run(caller(proxy.url))
        assert [len(g) for g in out.samples] == [2]


def test_the_simulated_agents_plug_in_through_agent_config(engine):
    with start_proxy(engine.url) as proxy:
        rollout = SlimeRollout(proxy_url=proxy.url, concurrency=4,
                               agent_config=AgentConfig(max_turns=2, tools=False, max_tokens=16))
        out = rollout(slime_args(), 0, DataSource(["Add 2 and 3.", "Name a colour."]))
        assert [len(g) for g in out.samples] == [2, 2]
        assert all(isinstance(seg.reward, float) for sess in sessions_of(out.samples) for seg in sess)


# ---------------------------------------------------------------- from_args and its refusals
def yaml_args(proxy_url, **over):
    base = dict(dressage_proxy_url=proxy_url, dressage_agent=f"{__name__}:tool_agent", rollout_batch_size=1,
                n_samples_per_prompt=2, rollout_top_p=1.0, use_rollout_routing_replay=True,
                num_layers=MODEL.num_layers, moe_router_topk=MODEL.topk, hf_checkpoint="/models/tiny")
    base.update(over)
    return SimpleNamespace(**base)


def test_from_args_builds_the_rollout_generate_rollout_runs_when_nothing_is_installed(engine, monkeypatch):
    with start_proxy(engine.url) as proxy:
        slime_rollout.install(None)
        try:
            args = yaml_args(proxy.url, dressage_session_retries=2, dressage_agent_concurrency=3)
            out = slime_rollout.generate_rollout(args, 0, DataSource(["Add 2 and 3."]))
            built = slime_rollout._installed
            assert built is not None and built.session_retries == 2 and built.concurrency == 3
            assert [len(g) for g in out.samples] == [2]
        finally:
            slime_rollout.install(None)
        cmd = SlimeRollout.from_args(yaml_args(proxy.url, dressage_agent=None,
                                               dressage_agent_command="python3 agent.py --prompt {prompt_file}"))
        assert isinstance(cmd.agent, CommandAgent) and cmd.agent.argv == ["python3", "agent.py", "--prompt",
                                                                          "{prompt_file}"]
        monkeypatch.setenv("MY_PROXY_ADMIN", "s3cret")
        assert SlimeRollout.from_args(yaml_args(proxy.url, dressage_admin_token_env="MY_PROXY_ADMIN")).admin_token \
            == "s3cret"


@pytest.mark.parametrize("over, match", [
    ({"rollout_top_p": 0.9}, "--rollout-top-p 0.9"),
    ({"num_layers": MODEL.num_layers + 1}, "--num-layers"),
    ({"moe_router_topk": MODEL.topk + 1}, "--moe-router-topk"),
    ({"dressage_agent_command": ["x"]}, "exactly one of dressage_agent"),
    ({"dressage_agent": None}, "exactly one of dressage_agent"),
    ({"dressage_admin_token": "abc"}, "dressage_admin_token: a token does not belong in the config file"),
    ({"dressage_agent_token_env": "DRESSAGE_TEST_UNSET_VAR"}, "DRESSAGE_TEST_UNSET_VAR is not set"),
    ({"dressage_restore": "nowhere"}, "dressage_restore"),
    ({"dressage_agent": "no_such_module_here:agent"}, "cannot import"),
    ({"dressage_proxy_url": None}, "dressage_proxy_url"),
    ({"dressage_restore": "trainer"}, "--custom-convert-samples-to-train-data-path dressage.integrations.slime_train"),
], ids=["top-p", "layers", "topk", "both-agents", "no-agent", "token-in-yaml", "unset-token-env", "restore",
        "bad-import", "no-url", "trainer-under-slimes-train"])
def test_from_args_refuses_what_the_samples_cannot_honour(engine, monkeypatch, over, match):
    monkeypatch.delenv("DRESSAGE_PROXY_URL", raising=False)
    with start_proxy(engine.url) as proxy:
        with pytest.raises(ConfigError, match=match):
            SlimeRollout.from_args(yaml_args(proxy.url, **over))


@pytest.mark.parametrize("over", [
    {},  # slime's train.py with its own conversion
    {"custom_convert_samples_to_train_data_path": TRAINER_CONVERSION},  # slime's train.py: plain actors
    {"custom_convert_samples_to_train_data_path": TRAINER_CONVERSION, TRAIN_ENTRY_MARK: True,
     "debug_rollout_only": True},  # slime returns before converting
], ids=["slime-conversion", "slime-actors", "debug-rollout-only"])
def test_a_trainer_rollout_nobody_would_restore_is_refused_before_any_session(engine, over):
    from dressage.tq import TransferQueue

    tq = TransferQueue.start({"deployment": "embedded", "num_storage_units": 1, "retention_s": None})
    try:
        with start_proxy(engine.url, tq=tq, routed_experts_dtype="uint8") as proxy:
            rollout = SlimeRollout(proxy_url=proxy.url, agent=tool_agent, concurrency=4, restore="trainer")
            source = DataSource(["Add 2 and 3."])
            with pytest.raises(ConfigError, match="dressage_restore: trainer .*every key would be left"):
                rollout(slime_args(batch=1, **over), 0, source)
            assert source.calls == [] and not proxy.service.core.sessions  # no session made, nothing written
            assert tq.client().total_keys() == 0
            out = rollout(slime_args(batch=1, **trainer_marks()), 0, source)  # what the train entry hands it
            assert len(out.samples[0]) == 2 and tq.client().total_keys() > 0  # held for the training ranks
    finally:
        tq.shutdown()


def test_the_proxy_says_the_shape_of_the_routed_experts_it_records(engine):
    from dressage.integrations.proxy_sessions import fetch_capabilities

    with start_proxy(engine.url, routed_experts_dtype="uint16") as proxy:
        model = fetch_capabilities(proxy.url)["model"]
        assert (model["num_layers"], model["topk"], model["routed_experts_dtype"]) == \
            (MODEL.num_layers, MODEL.topk, "uint16")


def test_from_args_refuses_r3_when_the_proxy_records_none(engine):
    with start_proxy(engine.url, r3=False) as proxy:
        with pytest.raises(ConfigError, match="--use-rollout-routing-replay"):
            SlimeRollout.from_args(yaml_args(proxy.url))


def test_the_constructor_wants_exactly_one_agent(engine):
    with pytest.raises(ConfigError, match="exactly one of agent"):
        SlimeRollout(proxy_url="http://127.0.0.1:9", agent=tool_agent, agent_config=AgentConfig())
    with pytest.raises(ConfigError, match="exactly one of agent"):
        SlimeRollout(proxy_url="http://127.0.0.1:9")


def test_trainer_restore_gives_each_rank_what_the_rollout_restore_gives_it(engine, monkeypatch):
    """The same agent and data source, once with the large fields restored by the rollout function on a
    Proxy without TQ, once left in TQ (2 StorageUnits) past slime's flatten, conversion and DP split:
    each training rank, told only the Proxy's URL, asks the Proxy for its TQ and restores exactly the
    data the TQ-off path hands it."""
    from dressage.integrations.slime import REFS_METADATA_KEY
    from dressage.integrations.slime_train import REFS_TRAIN_KEY, convert_samples_to_train_data, dressage_train_actor
    from dressage.tq import TransferQueue

    for name in ("DRESSAGE_TQ_SPEC", "DRESSAGE_PROXY_URL", "DRESSAGE_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    args = slime_args(advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
                      **trainer_marks())

    def rollout(proxy_url, restore):
        source = DataSource(["Add 2 and 3.", "Multiply 4 by 5."], metadata={"Multiply 4 by 5.": {"compress": True}})
        fn = SlimeRollout(proxy_url=proxy_url, agent=tool_agent, concurrency=4, restore=restore)
        try:
            return fn(args, 0, source)
        finally:
            fn.close()

    def per_rank(out):
        samples = flatten_like_slime(out.samples)
        data = convert_samples_to_train_data(args, samples)
        return samples, split_like_slime(data, interleaved(len(samples), 2))

    with start_proxy(engine.url, routed_experts_dtype="uint8") as plain:
        off_samples, off_boxes = per_rank(rollout(plain.url, "rollout"))
    assert all(s.rollout_routed_experts is not None and REFS_METADATA_KEY not in s.metadata for s in off_samples)

    tq = TransferQueue.start({"deployment": "embedded", "num_storage_units": 2, "retention_s": None})
    try:
        with start_proxy(engine.url, tq=tq, routed_experts_dtype="uint8") as proxy:
            out = rollout(proxy.url, "trainer")
            samples, boxes = per_rank(out)
            assert not proxy.service.trajectories.finalized  # handed over: the Proxy holds nothing
            assert out.metrics["dressage/tq_bytes_restored"] == 0
            # The rollout's output carries refs only: no large field on any slime Sample.
            assert len(samples) == len(off_samples) == 6  # two of the four sessions have two Segments
            assert all(s.rollout_log_probs is None and s.rollout_routed_experts is None
                       and REFS_METADATA_KEY in s.metadata for s in samples)
            keys = tq.client().total_keys()
            assert keys > 0  # held for the training ranks
            units = [int(row["keys"]) for row in tq.stats().values()]
            assert len(units) == 2 and all(n > 0 for n in units)
            for box in boxes:
                data = rank_data(box)
                assert REFS_TRAIN_KEY in data and "rollout_log_probs" not in data \
                    and "rollout_routed_experts" not in data
            ratio = sum(len(b) for b in boxes) / sum(len(b) for b in off_boxes)
            print(f"\nper-rank rollout_data pickled, refs / restored: {[len(b) for b in boxes]} / "
                  f"{[len(b) for b in off_boxes]} B, ratio {ratio:.3f}")
            assert ratio < 0.35  # int32 R3 rows (4 layers x top-2: 32 B a token) are most of what refs leave out

            # Each rank knows only the Proxy's URL (slime's YAML sets it on the args every actor gets).
            actors = train_ranks(dressage_train_actor(MegatronActorStandIn),
                                 SimpleNamespace(dressage_proxy_url=proxy.url), boxes)
            try:
                for actor, want in zip(actors, off_boxes):
                    assert_same(actor.taken, rank_data(want))  # bit for bit, dtypes and shapes included
                    assert actor.taken["rollout_routed_experts"][0].dtype == torch.int32
                    assert actor.taken["rollout_log_probs"][0].dtype == torch.float32
                    assert REFS_TRAIN_KEY not in actor.taken
            finally:
                for actor in actors:
                    if actor._dressage_refs is not None:
                        actor._dressage_refs.client.close()
            # Every rank released its keys after its step.
            assert tq.client().total_keys() == 0 and sum(int(row["keys"]) for row in tq.stats().values()) == 0
    finally:
        tq.shutdown()


@pytest.fixture()
def tq1():
    from dressage.tq import TransferQueue

    q = TransferQueue.start({"deployment": "embedded", "num_storage_units": 1, "retention_s": None})
    yield q
    q.shutdown()


def _restoring(monkeypatch, during):
    """The rollout's TrainingReader with ``during()`` run before each restore."""
    real = slime_rollout.TrainingReader

    class Reader(real):
        def restore(self, samples):
            during()
            return super().restore(samples)

    monkeypatch.setattr(slime_rollout, "TrainingReader", Reader)


@pytest.mark.parametrize("how", ["restore", "shape", "ack"])
def test_a_failed_collect_discards_the_rollouts_sessions_and_their_keys(engine, tq1, monkeypatch, how):
    from dressage.errors import LostSamplesError, ProxyStatusError

    with start_proxy(engine.url, tq=tq1, routed_experts_dtype="uint8") as proxy:
        rollout = SlimeRollout(proxy_url=proxy.url, agent=tool_agent, concurrency=4)
        made = []
        real_read = rollout._source.read

        def read(**kw):
            made.extend(kw["session_ids"])
            assert tq1.client().total_keys() > 0  # the sessions' large fields wait in TQ
            return real_read(**kw)

        monkeypatch.setattr(rollout._source, "read", read)
        if how == "restore":
            _restoring(monkeypatch, lambda: (_ for _ in ()).throw(LostSamplesError("a StorageUnit lost these")))
            error = LostSamplesError
        elif how == "shape":
            def shape(finished, session_ids, batch):  # what a read missing a session's Samples meets
                raise TrajectoryError(f"the read returned no Samples for sessions {session_ids[:1]}")
            monkeypatch.setattr(rollout, "_shape", shape)
            error = TrajectoryError
        else:
            def ack(batch):
                raise ProxyStatusError("HTTP 507: journal_disk_full", status_code=507)
            monkeypatch.setattr(rollout._source, "ack", ack)
            error = ProxyStatusError
        with pytest.raises(error):
            rollout(slime_args(batch=1), 0, DataSource(["Add 2 and 3."]))
        kept = proxy.service.trajectories
        assert len(made) == 2 and not kept.finalized and len(kept.leases) == 0  # discarded, no read held
        assert tq1.client().total_keys() == 0  # their keys went with them
        for sid in made:
            assert proxy.service.core.state_of(sid) == "discarded"
        monkeypatch.undo()
        rollout(slime_args(batch=1), 1, DataSource(["Multiply 4 by 5."]))  # the next rollout is not hindered
        assert not kept.finalized and tq1.client().total_keys() == 0


def test_a_session_another_named_read_took_over_during_the_restore_keeps_its_keys_for_that_reader(engine, tq1,
                                                                                                   monkeypatch):
    from dressage.rollout.manager import sample_ref_keys
    from dressage.train import TrainingReader, release_batch
    from dressage.train.remote import ProxyTrajectorySource

    with start_proxy(engine.url, tq=tq1, routed_experts_dtype="uint8") as proxy:
        kept = proxy.service.trajectories
        other = ProxyTrajectorySource(proxy.url)
        taken = []

        def take_one():  # e.g. an operator's named read of one session, while the rollout restores
            if not taken:
                taken.append(other.read(session_ids=[sorted(kept.finalized)[0]], lease=True))

        _restoring(monkeypatch, take_one)
        out = SlimeRollout(proxy_url=proxy.url, agent=tool_agent, concurrency=4)(
            slime_args(batch=1), 0, DataSource(["Add 2 and 3."]))
        assert len(out.samples[0]) == 2
        theirs = taken[0]
        their_keys = sample_ref_keys(theirs.samples)
        assert their_keys and tq1.client().total_keys() == len(their_keys)  # the rollout released only its own
        TrainingReader(other.client()).restore(theirs.samples)  # the other reader's restore finds them all
        other.ack(theirs)
        release_batch(other.client(), theirs.acknowledged_keys())
        assert tq1.client().total_keys() == 0 and not kept.finalized


@pytest.mark.parametrize("lost", ["expired", "proxy-restarted"])
def test_a_restore_that_outlives_its_read_lease_is_still_acknowledged(engine, tq1, monkeypatch, lost):
    import time

    from dressage.proxy.upstream.leases import ReadLeases

    with start_proxy(engine.url, tq=tq1, routed_experts_dtype="uint8", lease_s=0.3) as proxy:
        kept = proxy.service.trajectories
        if lost == "expired":
            _restoring(monkeypatch, lambda: time.sleep(0.6))  # a large batch's restore, longer than the lease
        else:
            def restart():  # a Proxy that restarted from its journal keeps the trajectories, not the leases
                kept.leases = ReadLeases()
            _restoring(monkeypatch, restart)
        rollout = SlimeRollout(proxy_url=proxy.url, agent=tool_agent, concurrency=4)
        out = rollout(slime_args(batch=1), 0, DataSource(["Add 2 and 3."]))
        samples = flatten_like_slime(out.samples)
        assert len(out.samples[0]) == 2 and all(s.rollout_routed_experts is not None for s in samples)
        assert out.metrics["dressage/tq_bytes_restored"] > 0
        assert not kept.finalized and len(kept.leases) == 0  # acknowledged: the Proxy forgot them
        assert tq1.client().total_keys() == 0  # restored, acknowledged and released
        if lost == "expired":
            assert kept.leases.expired == 1
