"""``dressage run`` end to end: TQ on and off give the same restored Samples; nothing is left behind."""

import json

import pytest

from dressage.cli import main
from dressage.dataplane import DataPlaneConfig
from dressage.fields import get_model
from dressage.harness.run import RunConfig, run_pipeline
from dressage.harness.run.config import AgentsConfig, ClusterConfig, InferenceConfig, ReportConfig, RolloutConfig
from dressage.tq.config import TransferQueueSelection


def _cfg(tq: bool, dtype: str, params=None, *, num_rollouts=2, **kw):
    dp = DataPlaneConfig(model=get_model("qwen3.6-35b-a3b"), use_rollout_routing_replay=True,
                         enable_transfer_queue=tq, transfer_params=params, routed_experts_dtype=dtype)
    return RunConfig(data_plane=dp, seed=7, report=ReportConfig(progress=False),
                     rollout=RolloutConfig(num_rollouts=num_rollouts, rollout_batch_size=3, n_samples_per_prompt=2),
                     agents=AgentsConfig(max_turns=3, max_tokens=48, retry_rate=0.3),
                     inference=InferenceConfig(mean_response_tokens=24, tool_call_rate=0.5), **kw)


def test_run_digest_is_identical_with_tq_on_and_off_and_every_dtype():
    off = run_pipeline(_cfg(False, "int32"))
    assert off.sessions == 12 and off.segments >= 12 and off.agent["errors"] == 0
    assert off.rollout_manager_path_bytes > off.large_field_bytes["routed_experts"] // 2
    for dtype, params in (("uint8", None), ("uint16", ("routed_experts",)), ("int32", ("logprobs",))):
        on = run_pipeline(_cfg(True, dtype, params))
        assert on.samples_digest == off.samples_digest, (dtype, params)
        assert on.tq_keys_left == 0
        assert on.segments == off.segments and on.tokens == off.tokens
        if params is None:
            # Only token fields and refs crossed the RolloutManager path.
            assert on.rollout_manager_path_bytes < off.rollout_manager_path_bytes / 20
            assert on.peak_memory_bytes["proxy_large_fields"] == 0


def test_run_command_writes_the_json_interface(tmp_path, capsys):
    out = tmp_path / "run.json"
    rc = main(["run", "--num-rollouts", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
               "--max-turns", "2", "--max-tokens", "32", "--use-rollout-routing-replay", "--enable-transfer-queue",
               "--routed-experts-dtype", "uint8", "--no-progress", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    for key in ("sessions", "segments", "tokens", "samples_digest", "peak_memory_bytes", "large_field_bytes"):
        assert key in data
    assert data["sessions"] == 4 and data["tq_keys_left"] == 0
    assert len(data["samples_digest"]) == 64
    assert "samples digest" in capsys.readouterr().out


def test_routed_experts_offload_without_r3_fails_at_startup(capsys):
    rc = main(["run", "--enable-transfer-queue", "--transfer-params", "routed_experts", "--no-progress"])
    assert rc == 2
    assert "--use-rollout-routing-replay" in capsys.readouterr().err


@pytest.mark.ray
def test_run_on_ray_matches_embedded(tmp_path):
    import ray

    from dressage.tq import load_config

    embedded = run_pipeline(_cfg(True, "uint8", num_rollouts=1))
    # A fresh local cluster, never one another process on this host happens to run.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = run_pipeline(_cfg(True, "uint8", num_rollouts=1, cluster=ClusterConfig(ray=True),
                                   transfer_queue=TransferQueueSelection(config=load_config({"deployment": "ray"}))))
    finally:
        ray.shutdown()
    assert on_ray.samples_digest == embedded.samples_digest
    assert on_ray.tq_keys_left == 0
