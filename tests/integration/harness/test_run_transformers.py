"""``dressage run --engine transformers``: the main job on the real random-weight tiny Qwen3-MoE.

The engine answers with the real Qwen3 tokenizer and chat template; the R3 rows come from the
model's router; with TQ on the trainer restores them and its own copy of the model, routing
forced to them, reproduces every recorded logprob bit for bit.
"""

import json

import pytest

pytest.importorskip("torch", reason="the transformers engine needs torch (the hf extra)")
pytest.importorskip("transformers", reason="the transformers engine needs transformers (the hf extra)")

from dressage.cli import main  # noqa: E402
from dressage.dataplane import DataPlaneConfig  # noqa: E402
from dressage.errors import ConfigError, TokenizerError  # noqa: E402
from dressage.fields import get_model  # noqa: E402
from dressage.harness.run import RunConfig  # noqa: E402
from dressage.harness.run.config import ClusterConfig, InferenceConfig  # noqa: E402
from dressage.tokenizer.packaged import qwen3_tokenizer_dir  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def qwen3_files():
    try:
        return qwen3_tokenizer_dir()
    except TokenizerError as exc:
        pytest.skip(f"real Qwen3 tokenizer unavailable: {exc}")


@pytest.mark.slow
def test_main_job_on_the_transformers_engine_with_tq_replays_logprobs_bit_for_bit(tmp_path, capsys):
    out = tmp_path / "run.json"
    rc = main(["run", "--engine", "transformers", "--num-rollouts", "1", "--rollout-batch-size", "1",
               "--n-samples-per-prompt", "2", "--max-turns", "2", "--max-tokens", "24", "--dp-size", "1",
               "--use-rollout-routing-replay", "--enable-transfer-queue", "--routed-experts-dtype", "uint8",
               "--no-progress", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    data = json.loads(out.read_text())
    tiny = get_model("tiny-qwen3-moe")
    assert data["config"]["model"] == "tiny-qwen3-moe" and data["config"]["engine"] == "transformers"
    assert data["sessions"] == 2 and data["agent"]["errors"] == 0 and data["tq_keys_left"] == 0
    # R3 rows of the real model, [T-1, layers, topk] int32 per Sample, restored from TQ.
    assert data["tq_bytes_read"] > 0
    assert data["large_field_bytes"]["routed_experts"] == 4 * (data["tokens"] - data["segments"]) * tiny.num_layers * tiny.topk
    replay = data["replay"]
    assert replay["samples"] == data["segments"]
    assert replay["tokens"] == data["trained_tokens"] > 0
    assert replay["identical_tokens"] == replay["tokens"]
    assert replay["max_abs_diff"] == 0.0 and replay["max_sum_abs_diff"] <= 1e-6
    assert "tiny-qwen3-moe (engine: transformers)" in printed
    assert f"{replay['tokens']} / {replay['tokens']} logprobs bit-identical" in printed
    assert printed.strip().splitlines()[-1].startswith("PASS: ")
    assert f"R3 replay reproduces {replay['tokens']} logprobs bit for bit" in printed


def test_transformers_engine_refuses_what_it_cannot_do():
    tiny = DataPlaneConfig(model=get_model("tiny-qwen3-moe"), use_rollout_routing_replay=True)
    with pytest.raises(ConfigError, match="leave out --engine-url"):
        RunConfig(data_plane=tiny, inference=InferenceConfig(backend="transformers", engine_url="http://127.0.0.1:1"))
    with pytest.raises(ConfigError, match="leave out --ray"):
        RunConfig(data_plane=tiny, inference=InferenceConfig(backend="transformers"), cluster=ClusterConfig(ray=True))
    with pytest.raises(ConfigError, match="runs tiny-qwen3-moe, but the data plane records the shape of qwen3.6-35b-a3b"):
        RunConfig(data_plane=DataPlaneConfig(), inference=InferenceConfig(backend="transformers"))
    with pytest.raises(ConfigError, match="inference.backend must be one of builtin, transformers"):
        InferenceConfig(backend="vllm")
