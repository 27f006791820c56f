"""``dressage bench memory`` end to end on the small preset (one dtype): the JSON's structure, a valid
capacity baseline, and where the large fields were held on each path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dressage.capacity.baseline import WITH_TQ_COMPONENTS, WITHOUT_TQ_COMPONENTS, baseline_from_dict

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DRESSAGE = [sys.executable, "-m", "dressage"]


@pytest.fixture(params=["process", "ray"])
def report(request, tmp_path_factory, bench_command) -> dict:
    """One small run per Proxy deployment: its own process drained over /trajectory/read, or a Ray actor."""
    out = tmp_path_factory.mktemp("bench_memory")
    path = out / "memory.json"
    cmd = [*DRESSAGE, "bench", "memory", "--preset", "small", "--dtypes", "uint8", "--json", str(path),
           "--plot-dir", str(out / "plots"), "--no-progress", "--proxy-deployment", request.param]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "M_master (peak of the sum)" in proc.stdout
    assert "small preset's sizes cannot meet the targets" in proc.stdout   # they are for --preset full
    data = json.loads(path.read_text())
    data["_plot_dir"] = str(out / "plots")
    return data


def _json_has_the_issue_interface(report):
    assert report["routed_experts_dtype"] == "uint8"
    assert "--preset full" in report["targets_note"]
    assert set(report["without_tq"]["components"]) == set(WITHOUT_TQ_COMPONENTS)
    assert set(report["with_tq"]["components"]) == set(WITH_TQ_COMPONENTS)
    for path in ("without_tq", "with_tq"):
        block = report[path]
        assert block["master_peak_bytes"] > 0
        # The peak of the sum at one instant never exceeds the sum of each component's own peak.
        assert block["master_peak_bytes"] <= sum(block["components"].values())
    ratio = report["with_tq"]["master_peak_bytes"] / report["without_tq"]["master_peak_bytes"]
    assert report["master_peak_ratio"] == pytest.approx(ratio, abs=1e-4)
    assert set(report["by_dtype"]) == {"uint8"}
    assert [t["name"] for t in report["targets"]] == [
        "master_peak_ratio", "rollout_manager_ratio", "object_store_ratio", "proxy_ratio"]


def _report_is_a_capacity_baseline(report):
    baseline = baseline_from_dict(report)
    assert baseline.config.routed_experts_dtype == "uint8"
    assert baseline.config.nodes == 2
    assert baseline.with_tq.master_peak_bytes == report["with_tq"]["master_peak_bytes"]


def _storage_units_held_the_large_fields_and_the_rollout_manager_did_not(report):
    on, off = report["with_tq"]["logical"], report["without_tq"]["logical"]
    # Payload stays off the head node (the master): node 1's unit holds all of it.
    assert on["tq_storage_unit_master"] == 0 and on["tq_storage_unit_node1"] > 0
    assert on["rollout_manager_large_fields"] == 0
    assert on["proxy_large_fields"] == 0
    assert off["rollout_manager_large_fields"] > 0
    assert off["proxy_large_fields"] > 0
    # The master's StorageUnit process stored nothing, so it grew by less than the payload node 1 holds;
    # the RolloutManager grew far less with TQ.
    assert report["with_tq"]["above_idle"]["tq_storage_unit_master"] < on["tq_storage_unit_node1"]
    assert report["with_tq"]["above_idle"]["rollout_manager"] < report["without_tq"]["above_idle"]["rollout_manager"]


def _both_paths_trained_on_the_same_samples(report):
    pair = report["by_dtype"]["uint8"]
    assert pair["samples_digest_match"] is True
    assert pair["without_tq"]["counts"]["segments"] == pair["with_tq"]["counts"]["segments"] > 0


def _timelines_and_plots(report):
    tl = report["timelines"]["uint8"]
    for path in ("without_tq", "with_tq"):
        assert len(tl[path]["t"]) == len(tl[path]["master"]) > 3
        assert max(tl[path]["master"]) >= report[path]["master_peak_bytes"]  # the peak is after warm-up
    plots = Path(report["_plot_dir"])
    assert (plots / "memory_timeline.png").stat().st_size > 0
    assert (plots / "memory_batch_sizes.png").stat().st_size > 0
    points = report["batch_size_projection"]["points"]
    assert [p["rollout_batch_size"] for p in points] == sorted(p["rollout_batch_size"] for p in points)
    assert all(p["without_tq"] > p["with_tq"] > 0 for p in points)


def _each_release_leaves_no_state_behind_and_the_wall_is_reported(report):
    pair = report["by_dtype"]["uint8"]
    on = pair["with_tq"]
    assert pair["wall_ratio"] == pytest.approx(on["wall_s"] / pair["without_tq"]["wall_s"], abs=1e-4)
    assert len(on["rollout_s"]) == len(on["rollouts"]) == report["bench_config"]["num_rollouts"]
    for r in on["rollouts"]:
        assert set(r["phase_s"]) == {"rollout", "deliver", "take_batch", "train", "release"}
        after = r["after_release"]
        # Every key of the batch is gone from the directory and from every unit: nothing carries over.
        assert after["tq_units"] and all(u["keys"] == 0 and u["directory_keys"] == 0 and u["pending"] == 0
                                         for u in after["tq_units"].values()), after
        assert after["proxy"]["sessions"] == 0 and after["proxy"]["write_behind_pending"] == 0
    # The head node runs no StorageUnit process while node 1 has one.
    assert on["components"]["tq_storage_unit_master"] == 0
    assert 0 < on["ray_actor_floor_bytes"] < on["idle"]["rollout_manager"] * 1.5
    rm = next(t for t in report["targets"] if t["name"] == "rollout_manager_ratio")
    assert rm["floor_bytes"] > 0 and rm["above_floor_value"] is not None
    # The Ray actor floor is a floor of the Proxy only where the Proxy is a Ray actor.
    proxy = next(t for t in report["targets"] if t["name"] == "proxy_ratio")
    assert ("above_floor_value" in proxy) == (report["bench_config"]["proxy_deployment"] == "ray")


def test_one_run_per_deployment_passes_every_check(report):
    # One (costly) run per Proxy deployment, every check on it: a module-scoped fixture shared by
    # several tests may be built twice when the tests are spread over xdist workers.
    _json_has_the_issue_interface(report)
    _report_is_a_capacity_baseline(report)
    _storage_units_held_the_large_fields_and_the_rollout_manager_did_not(report)
    _both_paths_trained_on_the_same_samples(report)
    _timelines_and_plots(report)
    _each_release_leaves_no_state_behind_and_the_wall_is_reported(report)
