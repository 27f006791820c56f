"""R3 sizing by formula and the per-Segment field breakdown, against the seed's published numbers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.capacity import (
    CapacityConfig,
    distribution_mean,
    parse_segments_distribution,
    segment_breakdown,
    size_batch,
)
from dressage.capacity.sizing import per_token_bytes, r3_growth
from dressage.errors import ConfigError
from dressage.fields.models import ModelSpec, get_model

TIB = 2**40


def glm(**kw) -> CapacityConfig:
    args = dict(model=get_model("glm-5.2-744b-a40b"), context_length=256 * 1024, rollout_batch_size=512,
                n_samples_per_prompt=8, routed_experts_dtype="int32")
    args.update(kw)
    return CapacityConfig(**args)


def qwen(**kw) -> CapacityConfig:
    args = dict(model=get_model("qwen3.6-35b-a3b"), context_length=64 * 1024, rollout_batch_size=512,
                n_samples_per_prompt=8, nodes=2)
    args.update(kw)
    return CapacityConfig(**args)


def test_glm_256k_512x8_int32_one_segment_is_2_34_tib():
    s = size_batch(glm())
    assert s.trajectories == 4096 and s.segments == 4096
    # 256K x 75 x 8 x 4 B x 4096 is exactly 2400 GiB.
    assert s.r3_bytes == 262_144 * 75 * 8 * 4 * 4096 == 2400 * 2**30
    assert round(s.r3_bytes / TIB, 2) == 2.34


def test_glm_mean_ten_segments_is_23_4_tib():
    s = size_batch(glm(mean_segments=10))
    assert s.segments == 40_960
    assert round(s.r3_bytes / TIB, 1) == 23.4
    assert s.r3_bytes == 10 * size_batch(glm()).r3_bytes


def test_stored_r3_drops_one_row_per_segment():
    s = size_batch(glm())
    assert s.r3_bytes - s.r3_stored_bytes == s.segments * 75 * 8 * 4


def test_mean_segment_tokens_scales_r3_and_is_bounded_by_context():
    half = size_batch(glm(mean_segment_tokens=128 * 1024))
    assert half.r3_bytes * 2 == size_batch(glm()).r3_bytes
    with pytest.raises(ConfigError, match="--mean-segment-tokens"):
        glm(mean_segment_tokens=256 * 1024 + 1)


def test_uint16_halves_and_uint8_quarters_r3():
    full = size_batch(glm()).r3_bytes
    assert size_batch(glm(routed_experts_dtype="uint16")).r3_bytes * 2 == full
    assert size_batch(glm(routed_experts_dtype="uint8")).r3_bytes * 4 == full


def test_dtype_too_narrow_for_expert_count_is_rejected():
    many = ModelSpec(name="m", num_layers=2, topk=2, num_experts=257)
    with pytest.raises(ConfigError, match="--routed-experts-dtype.*uint8.*257"):
        glm(model=many, routed_experts_dtype="uint8")
    glm(model=many, routed_experts_dtype="uint16")
    glm(model=replace(many, num_experts=256), routed_experts_dtype="uint8")
    huge = replace(many, num_experts=65_537)
    with pytest.raises(ConfigError, match="uint16.*65537"):
        glm(model=huge, routed_experts_dtype="uint16")
    glm(model=replace(many, num_experts=65_536), routed_experts_dtype="uint16")
    glm(model=huge, routed_experts_dtype="int32")
    with pytest.raises(ConfigError, match="uint8"):
        glm(model=get_model("qwen3-next-80b-a3b"), routed_experts_dtype="uint8")


def test_unknown_dtype_names_the_flag():
    with pytest.raises(ConfigError, match="--routed-experts-dtype"):
        glm(routed_experts_dtype="int4")


def test_cluster_r3_growth_qwen_64k_40_layers_to_glm_256k_75_layers_is_7_5x():
    g = r3_growth(glm(nodes=32), qwen())
    assert g == pytest.approx(7.5)
    # The master's StorageUnit holds 1/nodes of it: 7.5 x 2 / 32.
    local = size_batch(glm(nodes=32)).r3_bytes_per_storage_unit / size_batch(qwen()).r3_bytes_per_storage_unit
    assert local == pytest.approx(0.46875)
    assert round(local, 2) == 0.47


@pytest.mark.parametrize("key, value", [
    ("context_length", 0), ("rollout_batch_size", -1), ("n_samples_per_prompt", 0), ("nodes", 0),
    ("mean_segments", 0.0), ("mean_segments", -2.0), ("host_memory_bytes", 0), ("rollout_batch_size", 1.5),
    ("message_bytes_per_token", -1.0),
])
def test_zero_or_negative_counts_name_the_flag(key, value):
    flag = "--host-memory" if key == "host_memory_bytes" else "--" + key.replace("_", "-")
    with pytest.raises(ConfigError, match=f"{flag} \\({key}\\)"):
        glm(**{key: value})


@pytest.mark.parametrize("key, value", [
    ("mean_segments", 1e308), ("mean_segments", 2.0 ** 21), ("context_length", 10**100), ("context_length", 2**31 + 1),
    ("rollout_batch_size", 2**25), ("n_samples_per_prompt", 10**30), ("nodes", 2**17),
    ("message_bytes_per_token", 1e300), ("host_memory_bytes", 2**60),
])
def test_values_past_any_real_batch_are_refused_naming_the_flag(key, value):
    flag = "--host-memory" if key == "host_memory_bytes" else "--" + key.replace("_", "-")
    with pytest.raises(ConfigError, match=f"{flag} \\({key}\\) must be at most"):
        glm(**{key: value})


def test_the_bounds_leave_room_for_every_real_batch():
    assert glm(context_length=2**31, mean_segments=1000.0, nodes=4096).segments > 0
    with pytest.raises(ConfigError, match="--mean-segments"):
        glm(mean_segments="1e400")
    with pytest.raises(ConfigError, match="--host-memory: too large"):
        glm(host_memory_bytes="1e308PiB")


def test_python_list_breakdown_comes_close_to_the_seed_92_4_percent_r3_share():
    shares = {f.name: f.share for f in segment_breakdown(qwen(), "python-list")}
    # Seed's table: R3 92.4%, logprobs 2.3%, token ids 2.1%, messages 2.3%, others 0.9%.
    assert shares["routed_experts"] == pytest.approx(0.924, abs=0.01)
    assert shares["logprobs"] == pytest.approx(0.023, abs=0.002)
    assert shares["messages"] == pytest.approx(0.023, abs=0.002)
    assert shares["tokens"] == pytest.approx(0.021, abs=0.006)
    assert shares["loss_mask"] + shares["token_versions"] == pytest.approx(0.009, abs=0.004)


def test_list_elements_cost_about_32_bytes_and_numpy_their_itemsize():
    lists, arrays = per_token_bytes(qwen(), "python-list"), per_token_bytes(qwen(), "numpy")
    assert lists["logprobs"] == 32  # 8-byte slot + 24-byte float object on 64-bit CPython
    assert 32 <= lists["tokens"] <= 40
    assert arrays == {"routed_experts": 1280.0, "logprobs": 4.0, "tokens": 4.0, "messages": 32.0,
                      "loss_mask": 1.0, "token_versions": 4.0}


def test_numpy_breakdown_bytes_follow_the_field_dtypes():
    fields = {f.name: f.bytes for f in segment_breakdown(qwen(), "numpy")}
    t = 64 * 1024
    assert fields["routed_experts"] == t * 40 * 8 * 4
    assert fields["tokens"] == fields["logprobs"] == fields["token_versions"] == 4 * t
    assert fields["loss_mask"] == t
    assert sum(f.share for f in segment_breakdown(qwen(), "numpy")) == pytest.approx(1.0)


def test_compact_dtype_lowers_the_r3_share():
    int32 = segment_breakdown(qwen(), "numpy")[0]
    uint8 = segment_breakdown(qwen(routed_experts_dtype="uint8"), "numpy")[0]
    assert int32.name == uint8.name == "routed_experts"
    assert uint8.bytes * 4 == int32.bytes and uint8.share < int32.share


def test_unknown_representation_is_rejected():
    with pytest.raises(ConfigError, match="representation"):
        segment_breakdown(qwen(), "arrow")


def test_segments_distribution_mean():
    dist = parse_segments_distribution("1:0.5, 2:0.3,4:0.2")
    assert dist == {1: 0.5, 2: 0.3, 4: 0.2}
    assert distribution_mean(dist) == pytest.approx(1.9)
    assert distribution_mean(parse_segments_distribution("1:3,3:1")) == pytest.approx(1.5)
    for bad in ("", "x:1", "0:1", "2:-1", "1:abc", "1:0", "1:1,1:1", "2:0.5,1:0.5,2:0.1", "2000000:1"):
        with pytest.raises(ConfigError, match="--segments-distribution"):
            distribution_mean(parse_segments_distribution(bad))


@settings(deadline=None)  # a loaded CI machine must not turn a slow example into a failure
@given(
    tokens=st.integers(1, 1 << 20), layers=st.integers(1, 128), topk=st.integers(1, 16),
    batch=st.integers(1, 2048), samples=st.integers(1, 16), segments=st.integers(1, 12),
    dtype=st.sampled_from(["uint8", "uint16", "int32"]),
)
def test_r3_bytes_is_the_seed_formula(tokens, layers, topk, batch, samples, segments, dtype):
    model = ModelSpec(name="m", num_layers=layers, topk=topk, num_experts=max(topk, 16))
    c = CapacityConfig(model=model, context_length=tokens, rollout_batch_size=batch,
                       n_samples_per_prompt=samples, mean_segments=float(segments), routed_experts_dtype=dtype)
    width = {"uint8": 1, "uint16": 2, "int32": 4}[dtype]
    s = size_batch(c)
    assert s.segments == batch * samples * segments
    assert s.r3_bytes == tokens * layers * topk * width * batch * samples * segments
    assert isinstance(s.r3_bytes, int)
