"""Projection of master-node peaks from a baseline, thresholds against host memory, and the plot."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.capacity import (
    SEED_QWEN_BASELINE,
    CapacityConfig,
    crossing_batch,
    max_rollout_batch_size,
    plot_projection,
    project,
    sweep,
)
from dressage.errors import ConfigError
from dressage.fields.models import get_model
from dressage.units import parse_bytes

GIB, TIB = 2**30, 2**40


def glm(**kw) -> CapacityConfig:
    args = dict(model=get_model("glm-5.2-744b-a40b"), context_length=256 * 1024, rollout_batch_size=512,
                n_samples_per_prompt=8, nodes=32)
    args.update(kw)
    return CapacityConfig(**args)


def test_projecting_the_baseline_onto_itself_returns_its_measurements():
    p = project(SEED_QWEN_BASELINE.config, SEED_QWEN_BASELINE)
    assert p.without_tq.master_peak_bytes == pytest.approx(757 * GIB)
    assert p.with_tq.master_peak_bytes == pytest.approx(247 * GIB)
    for name, value in SEED_QWEN_BASELINE.with_tq.components.items():
        assert p.with_tq.components[name] == pytest.approx(value)
    for name, value in SEED_QWEN_BASELINE.without_tq.components.items():
        assert p.without_tq.components[name] == pytest.approx(value)


def test_a_projected_peak_is_never_below_its_largest_component():
    # One GLM-5.2 256K trajectory on one node: the master's StorageUnit dwarfs the rest, and the overlap
    # measured among the seed's comparable components would put the peak under it.
    p = project(glm(rollout_batch_size=1, n_samples_per_prompt=1, nodes=1), SEED_QWEN_BASELINE)
    for path in (p.with_tq, p.without_tq):
        assert path.master_peak_bytes >= max(path.components.values())
    assert p.with_tq.master_peak_bytes == pytest.approx(p.with_tq.components["tq_storage_unit_master"])


def test_growth_to_glm_256k_32_nodes_is_7_5x_cluster_and_0_47x_local_r3():
    g = project(glm(), SEED_QWEN_BASELINE).growth
    assert g.r3 == pytest.approx(7.5)
    assert g.tokens == pytest.approx(4.0)
    assert g.local_storage_unit_r3 == pytest.approx(0.46875)


def test_storage_unit_on_master_shrinks_with_nodes_and_dtype():
    su = "tq_storage_unit_master"
    int32_32 = project(glm(), SEED_QWEN_BASELINE).with_tq.components[su]
    int32_2 = project(glm(nodes=2), SEED_QWEN_BASELINE).with_tq.components[su]
    uint16_32 = project(glm(routed_experts_dtype="uint16"), SEED_QWEN_BASELINE).with_tq.components[su]
    assert int32_2 == pytest.approx(16 * int32_32)
    # R3 halves, the small logprob part does not: a little over half.
    assert 0.5 < uint16_32 / int32_32 < 0.51
    # 215.1 GiB x (7.5 blended with logprobs at x4) x 2/32.
    assert int32_32 / GIB == pytest.approx(215.1 * 7.5 * 2 / 32, rel=0.01)


def test_resident_components_with_tq_scale_with_token_volume_only():
    p = project(glm(), SEED_QWEN_BASELINE)
    for name in ("proxy", "rollout_manager", "object_store"):
        assert p.with_tq.components[name] == pytest.approx(4 * SEED_QWEN_BASELINE.with_tq.components[name])


def test_glm_projection_from_seed_figures_values():
    # Our model from the seed's inputs (docs/capacity.md explains why these differ from 3.84 / 0.33 TiB).
    off = project(glm(), SEED_QWEN_BASELINE).without_tq.master_peak_bytes / TIB
    on16 = project(glm(routed_experts_dtype="uint16"), SEED_QWEN_BASELINE).with_tq.master_peak_bytes / TIB
    assert off == pytest.approx(5.34, abs=0.01)
    assert on16 == pytest.approx(0.224, abs=0.002)
    assert on16 < 0.33 < 3.84 < off


def test_threshold_batch_for_3_84_tib_at_512_and_2tb_is_about_243():
    b = crossing_batch(3.84 * TIB, 512, parse_bytes("2TB"))
    assert round(b) == 243
    assert crossing_batch(3.84 * TIB, 512, parse_bytes("1.82TiB")) == pytest.approx(242.67, abs=0.01)


def test_max_batch_that_fits_is_exact_on_each_path():
    host = parse_bytes("2TB")
    c = glm(host_memory_bytes=host)
    for path in ("without_tq", "with_tq"):
        b = max_rollout_batch_size(c, SEED_QWEN_BASELINE, path)
        assert project(replace(c, rollout_batch_size=b), SEED_QWEN_BASELINE).path(path).master_peak_bytes <= host
        assert project(replace(c, rollout_batch_size=b + 1), SEED_QWEN_BASELINE).path(path).master_peak_bytes > host
    assert max_rollout_batch_size(c, SEED_QWEN_BASELINE, "without_tq") < 512
    assert max_rollout_batch_size(c, SEED_QWEN_BASELINE, "with_tq") > 512


def test_max_batch_is_zero_when_even_one_prompt_does_not_fit():
    c = glm(host_memory_bytes=GIB)
    assert max_rollout_batch_size(c, SEED_QWEN_BASELINE, "without_tq") == 0


def test_max_batch_needs_host_memory():
    with pytest.raises(ConfigError, match="--host-memory"):
        max_rollout_batch_size(glm(), SEED_QWEN_BASELINE, "with_tq")


def test_peak_is_proportional_to_batch_size():
    rows = sweep(glm(), SEED_QWEN_BASELINE, [128, 256, 512])
    assert rows[2][1] == pytest.approx(4 * rows[0][1]) and rows[1][2] == pytest.approx(2 * rows[0][2])


@settings(max_examples=40, deadline=None)
@given(segments=st.floats(1.0, 8.0), tokens_k=st.integers(8, 256), nodes=st.integers(1, 64),
       dtype=st.sampled_from(["uint8", "uint16", "int32"]))
def test_tq_peak_stays_below_the_centralized_path_and_more_segments_raise_it(segments, tokens_k, nodes, dtype):
    c = glm(mean_segments=segments, mean_segment_tokens=tokens_k * 1024, nodes=nodes, routed_experts_dtype=dtype)
    p = project(c, SEED_QWEN_BASELINE)
    assert p.with_tq.master_peak_bytes < p.without_tq.master_peak_bytes
    more = project(replace(c, mean_segments=segments * 2), SEED_QWEN_BASELINE)
    assert more.without_tq.master_peak_bytes > p.without_tq.master_peak_bytes


def test_plot_writes_a_png(tmp_path):
    out = plot_projection(glm(host_memory_bytes=parse_bytes("2TB"), routed_experts_dtype="uint16"),
                          SEED_QWEN_BASELINE, tmp_path / "fig5.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_into_missing_directory_names_the_flag(tmp_path):
    with pytest.raises(ConfigError, match="--plot"):
        plot_projection(glm(), SEED_QWEN_BASELINE, tmp_path / "no" / "such" / "dir.png")


@settings(max_examples=30, deadline=None)
@given(host_tib=st.floats(0.05, 50.0), segments=st.sampled_from([1.0, 1.5, 3.0]),
       path=st.sampled_from(["without_tq", "with_tq"]))
def test_max_batch_is_the_last_batch_under_the_host_line(host_tib, segments, path):
    host = int(host_tib * TIB)
    c = glm(host_memory_bytes=host, mean_segments=segments)
    b = max_rollout_batch_size(c, SEED_QWEN_BASELINE, path)
    peak = lambda n: project(replace(c, rollout_batch_size=n), SEED_QWEN_BASELINE).path(path).master_peak_bytes
    assert peak(b + 1) > host
    assert b == 0 or peak(b) <= host


def test_component_that_grows_with_tq_has_no_large_part():
    from dressage.capacity import baseline_from_dict, baseline_to_dict

    data = baseline_to_dict(SEED_QWEN_BASELINE)
    # A Proxy that holds more with TQ on (references, buffers) than without: nothing of it is offloaded.
    data["with_tq"]["components"]["proxy"] = data["without_tq"]["components"]["proxy"] + GIB
    b = baseline_from_dict(data)
    p = project(glm(), b)
    assert p.without_tq.components["proxy"] == pytest.approx(4 * b.without_tq.components["proxy"])


def test_crossing_batch_rejects_non_positive_inputs():
    for args in ((0, 512, TIB), (TIB, 0, TIB), (TIB, 512, 0)):
        with pytest.raises(ConfigError):
            crossing_batch(*args)


def test_unknown_path_is_rejected():
    with pytest.raises(ConfigError, match="path"):
        project(glm(), SEED_QWEN_BASELINE).path("sideways")
