"""slime's args as the rollout function's settings: import paths, the dressage_* keys, eval prompts."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dressage.agents import CommandAgent
from dressage.errors import ConfigError
from dressage.integrations.slime import SlimeSample
from dressage.integrations.slime_config import (TRAIN_ENTRY_MARK, TRAINER_CONVERSION, check_against_proxy,
                                                check_trainer_handoff, eval_prompt_sets, load_object,
                                                rollout_settings, sampling_params, trainer_metrics_address)


def test_import_paths_take_a_colon_or_a_dot():
    assert load_object("json:dumps", "k") is json.dumps
    assert load_object("json.dumps", "k") is json.dumps
    assert load_object("os.path:join", "k").__name__ == "join"
    with pytest.raises(ConfigError, match="k: 'json' has no attribute 'nope'"):
        load_object("json:nope", "k")
    with pytest.raises(ConfigError, match="k: expected an import path"):
        load_object("json", "k")


def test_settings_from_the_yaml_keys(monkeypatch):
    monkeypatch.setenv("DRESSAGE_PROXY_URL", "http://proxy:8000")
    monkeypatch.setenv("AGENT_TOK", "a")
    args = SimpleNamespace(dressage_agent_command=["cli", "{prompt_file}"], dressage_agent_timeout_s=30,
                           dressage_session_retries=0, dressage_agent_token_env="AGENT_TOK")
    got = rollout_settings(args)
    assert got["proxy_url"] == "http://proxy:8000" and got["token"] == "a" and got["admin_token"] is None
    assert isinstance(got["agent"], CommandAgent) and got["agent"].timeout_s == 30.0
    assert (got["concurrency"], got["session_retries"], got["max_group_replacements"], got["restore"]) == \
        (64, 0, None, "rollout")
    with pytest.raises(ConfigError, match="dressage_session_retries must be an integer >= 0"):
        rollout_settings(SimpleNamespace(dressage_agent="json:dumps", dressage_session_retries=-1))
    with pytest.raises(ConfigError, match="dressage_agent_reward goes with dressage_agent_command"):
        rollout_settings(SimpleNamespace(dressage_agent="json:dumps", dressage_agent_reward="json:loads"))
    with pytest.raises(ConfigError, match="dressage_agent_token: a token does not belong"):
        rollout_settings(SimpleNamespace(dressage_agent="json:dumps", dressage_agent_token="xyz"))


def test_sampling_params_are_slimes_rollout_settings():
    args = SimpleNamespace(rollout_temperature=0.7, rollout_top_p=1.0, rollout_top_k=20, rollout_max_response_len=512,
                           rollout_stop=["</s>"], rollout_stop_token_ids=[2])
    assert sampling_params(args) == {"temperature": 0.7, "top_p": 1.0, "top_k": 20, "max_new_tokens": 512,
                                     "stop": ["</s>"], "stop_token_ids": [2]}


def test_r3_shape_is_checked_only_when_slime_replays_routing():
    caps = {"features": {"rollout_routing_replay": True}, "model": {"name": "m", "num_layers": 4, "topk": 2}}
    check_against_proxy(SimpleNamespace(use_rollout_routing_replay=False, num_layers=9), caps)
    check_against_proxy(SimpleNamespace(use_rollout_routing_replay=True, num_layers=4, moe_router_topk=2), caps)
    with pytest.raises(ConfigError, match=r"--num-layers 9: .*\[T-1, 4, 2\]"):
        check_against_proxy(SimpleNamespace(use_rollout_routing_replay=True, num_layers=9, moe_router_topk=2), caps)


def test_eval_prompts_come_from_each_datasets_jsonl(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text('{"q": "a", "ans": 1, "metadata": {"k": 1}}\n\n{"q": "b", "ans": 2}\n')
    args = SimpleNamespace(eval_datasets=[SimpleNamespace(name="x", path=str(path), input_key="q", label_key="ans",
                                                          metadata_key=None, n_samples_per_eval_prompt=2)])
    [(name, samples, sampling)] = eval_prompt_sets(args, SlimeSample)
    assert name == "x"
    assert sampling == {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": None, "stop": None,
                        "stop_token_ids": None}  # neither the entry nor the args set one: slime's defaults
    assert [(s.prompt, s.label, s.index, s.group_index, s.metadata) for s in samples] == [
        ("a", 1, 0, 0, {"k": 1}), ("a", 1, 1, 0, {"k": 1}), ("b", 2, 2, 1, {}), ("b", 2, 3, 1, {})]
    # slime's inject_metadata: the dataset's rm_type, then its metadata_overrides, over each row's metadata
    tagged = SimpleNamespace(eval_datasets=[{"name": "t", "path": str(path), "input_key": "q", "rm_type": "math",
                                             "metadata_overrides": {"k": 9, "src": "t"}}])
    assert [s.metadata for s in eval_prompt_sets(tagged, SlimeSample)[0].samples] == [
        {"k": 9, "rm_type": "math", "src": "t"}, {"rm_type": "math", "k": 9, "src": "t"}]
    with pytest.raises(ConfigError, match="reads .jsonl"):
        eval_prompt_sets(SimpleNamespace(eval_datasets=[{"name": "p", "path": "x.parquet"}]), SlimeSample)
    with pytest.raises(ConfigError, match="line 1 of .* has no 'input'"):
        eval_prompt_sets(SimpleNamespace(eval_datasets=[{"name": "p", "path": str(path)}]), SlimeSample)


def test_a_training_ranks_metrics_port_is_offset_by_its_local_rank_and_checked(monkeypatch):
    monkeypatch.delenv("DRESSAGE_METRICS_PORT", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert trainer_metrics_address(SimpleNamespace()) is None  # no port: no metrics served
    assert trainer_metrics_address(SimpleNamespace(dressage_metrics_port=9400)) == ("0.0.0.0", 9400)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert trainer_metrics_address(SimpleNamespace(dressage_metrics_port=9400, dressage_metrics_host="10.0.0.2")) \
        == ("10.0.0.2", 9403)
    assert trainer_metrics_address(SimpleNamespace(dressage_metrics_port=0)) == ("0.0.0.0", 0)  # each a free port
    monkeypatch.setenv("DRESSAGE_METRICS_PORT", "9500")
    assert trainer_metrics_address(SimpleNamespace()) == ("0.0.0.0", 9503)
    for bad in (70000, -1, "9400", True):
        with pytest.raises(ConfigError, match="dressage_metrics_port must be a port number"):
            trainer_metrics_address(SimpleNamespace(dressage_metrics_port=bad))
    monkeypatch.setenv("DRESSAGE_METRICS_PORT", "x")
    with pytest.raises(ConfigError, match="DRESSAGE_METRICS_PORT must be a port number"):
        trainer_metrics_address(SimpleNamespace())


def trainer_args(**over):
    """slime's args as ``python -m dressage.integrations.slime_train`` hands them to the rollout function."""
    return SimpleNamespace(**{"dressage_agent": "json:dumps", "dressage_proxy_url": "http://proxy:8000",
                              "dressage_restore": "trainer", "custom_convert_samples_to_train_data_path":
                              TRAINER_CONVERSION, "debug_rollout_only": False, TRAIN_ENTRY_MARK: True, **over})


def test_trainer_restore_is_taken_only_where_slime_converts_splits_and_trains_with_dressages_actors():
    from dressage.integrations.slime_train import convert_samples_to_train_data

    assert load_object(TRAINER_CONVERSION, "k") is convert_samples_to_train_data  # the path slime loads
    assert rollout_settings(trainer_args())["restore"] == "trainer"
    for over, fix in [
        ({"custom_convert_samples_to_train_data_path": None}, f"--custom-convert-samples-to-train-data-path "
                                                              f"{TRAINER_CONVERSION} (got None"),
        ({"custom_convert_samples_to_train_data_path": "my.convert"}, "(got 'my.convert'"),
        ({"debug_rollout_only": True}, "no --debug-rollout-only"),
        ({TRAIN_ENTRY_MARK: None}, "python -m dressage.integrations.slime_train <slime args> in place of slime's "
                                   "train.py"),
    ]:
        args = trainer_args(**over)
        for check in (check_trainer_handoff, rollout_settings):
            with pytest.raises(ConfigError, match=r"dressage_restore: trainer .*every key would be left") as info:
                check(args)
            assert fix in str(info.value) and str(info.value).count("; ") == 0  # only what is wrong
    # slime's own train.py with its own conversion: both fixes named in one error.
    plain = trainer_args(custom_convert_samples_to_train_data_path=None, **{TRAIN_ENTRY_MARK: None})
    with pytest.raises(ConfigError, match="convert-samples.*; python -m dressage.integrations.slime_train"):
        check_trainer_handoff(plain)
    assert rollout_settings(trainer_args(dressage_restore="rollout", debug_rollout_only=True,
                                         custom_convert_samples_to_train_data_path=None))["restore"] == "rollout"
