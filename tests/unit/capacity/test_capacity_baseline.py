"""Baselines: the built-in seed figures and the memory benchmark's JSON schema, with errors naming keys."""

from __future__ import annotations

import copy
import json

import pytest

from dressage.capacity import SEED_QWEN_BASELINE, baseline_from_dict, baseline_to_dict, load_baseline, project
from dressage.errors import ConfigError

GIB = 2**30


def measured() -> dict:
    return {
        "without_tq": {"master_peak_bytes": 90 * GIB,
                       "components": {"proxy": 20 * GIB, "rollout_manager": 60 * GIB, "object_store": 20 * GIB}},
        "with_tq": {"master_peak_bytes": 30 * GIB,
                    "components": {"proxy": 5 * GIB, "rollout_manager": 3 * GIB, "object_store": 1 * GIB,
                                   "tq_controller": 1 * GIB, "tq_storage_unit_master": 25 * GIB}},
        "config": {"model": "qwen3.6-35b-a3b", "context_length": "32K", "rollout_batch_size": 64,
                   "n_samples_per_prompt": 8, "nodes": 1, "routed_experts_dtype": "uint8", "mean_segments": 1.5},
    }


def test_seed_baseline_carries_the_published_figures_and_says_so():
    b = SEED_QWEN_BASELINE
    assert "seed" in b.label and "published" in b.label
    assert b.without_tq.master_peak_bytes == 757 * GIB and b.with_tq.master_peak_bytes == 247 * GIB
    assert [round(b.without_tq.components[c] / GIB, 1) for c in ("proxy", "rollout_manager", "object_store")] \
        == [80.8, 591.7, 202.5]
    assert [round(b.with_tq.components[c] / GIB, 1)
            for c in ("proxy", "rollout_manager", "object_store", "tq_storage_unit_master")] == [28.6, 18.7, 1.4, 215.1]
    assert b.config.trajectories == 4096 and b.config.nodes == 2 and b.config.context_length == 65536
    assert any("Controller" in n for n in b.notes)


def test_measured_baseline_round_trips_through_the_schema():
    b = baseline_from_dict(measured())
    assert b.config.context_length == 32 * 1024 and b.config.routed_experts_dtype == "uint8"
    assert b.config.segments == 768 and b.representation == "numpy"
    again = baseline_from_dict(baseline_to_dict(b))
    assert again == b


def test_load_baseline_from_file_labels_it_by_file(tmp_path):
    path = tmp_path / "mem.json"
    path.write_text(json.dumps(measured()))
    b = load_baseline(path)
    assert b.label == "measured: mem.json"
    p = project(b.config, b)
    assert p.with_tq.master_peak_bytes == pytest.approx(30 * GIB)


@pytest.mark.parametrize("path, key", [
    (("with_tq", "components", "tq_controller"), "baseline.with_tq.components.tq_controller"),
    (("with_tq", "components", "tq_storage_unit_master"), "baseline.with_tq.components.tq_storage_unit_master"),
    (("without_tq", "components", "object_store"), "baseline.without_tq.components.object_store"),
    (("without_tq", "master_peak_bytes"), "baseline.without_tq.master_peak_bytes"),
    (("with_tq",), "baseline.with_tq"),
    (("config", "nodes"), "baseline.config.nodes"),
    (("config", "mean_segments"), "baseline.config.mean_segments"),
    (("config", "routed_experts_dtype"), "baseline.config.routed_experts_dtype"),
    (("config", "model"), "baseline.config.model"),
])
def test_missing_key_is_named(path, key):
    data = measured()
    block = data
    for part in path[:-1]:
        block = block[part]
    del block[path[-1]]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + " is missing"):
        baseline_from_dict(data)


@pytest.mark.parametrize("path, value, key", [
    (("with_tq", "components", "proxy"), -1, "baseline.with_tq.components.proxy"),
    (("with_tq", "components", "proxy"), "lots", "baseline.with_tq.components.proxy"),
    (("without_tq", "master_peak_bytes"), 0, "baseline.without_tq.master_peak_bytes"),
    (("without_tq", "master_peak_bytes"), 500 * GIB, "baseline.without_tq.master_peak_bytes"),
    (("config", "nodes"), 0, "baseline.config.nodes"),
    (("config", "context_length"), "lots", "baseline.config.context_length"),
    (("config", "model"), "gpt-9", "baseline.config.model"),
    (("config", "routed_experts_dtype"), "int4", "baseline.config.routed_experts_dtype"),
    (("config", "mean_segments"), -1, "baseline.config.mean_segments"),
    (("config", "representation"), "arrow", "baseline.config.representation"),
])
def test_bad_value_is_named(path, value, key):
    data = copy.deepcopy(measured())
    block = data
    for part in path[:-1]:
        block = block[part]
    block[path[-1]] = value
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        baseline_from_dict(data)


def test_uint8_baseline_for_a_512_expert_model_is_rejected():
    data = measured()
    data["config"]["model"] = "qwen3-next-80b-a3b"
    with pytest.raises(ConfigError, match=r"baseline\.config\.routed_experts_dtype: .*uint8"):
        baseline_from_dict(data)


def test_explicit_model_shape_in_baseline():
    data = measured()
    data["config"]["model"] = {"num_layers": 10, "topk": 4, "num_experts": 64}
    assert baseline_from_dict(data).config.model.num_layers == 10
    data["config"]["model"] = {"num_layers": 10, "topk": 4}
    with pytest.raises(ConfigError, match=r"baseline\.config\.model\.num_experts is missing"):
        baseline_from_dict(data)


def test_unreadable_or_invalid_file_names_the_flag(tmp_path):
    with pytest.raises(ConfigError, match="--baseline: cannot read"):
        load_baseline(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="--baseline: .* is not valid JSON"):
        load_baseline(bad)
    top = tmp_path / "list.json"
    top.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="baseline must be a JSON object"):
        load_baseline(top)
