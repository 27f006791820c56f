"""``dressage capacity``: JSON for the acceptance interface, text, plot, and errors that name the flag."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dressage.cli import main

GLM = ["capacity", "--model", "glm-5.2-744b-a40b", "--context-length", "256K", "--rollout-batch-size", "512",
       "--n-samples-per-prompt", "8", "--routed-experts-dtype", "int32"]
TIB = 2**40


def run_json(capsys, *extra: str) -> dict:
    assert main([*GLM, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_glm_json_reports_r3_trajectories_and_segments(capsys):
    out = run_json(capsys)
    assert out["r3_bytes"] == 2400 * 2**30 and isinstance(out["r3_bytes"], int)
    assert out["r3"] == "2.34 TiB"
    assert out["trajectories"] == 4096 and out["segments"] == 4096
    assert set(out["segment_breakdown"]) == {"numpy", "python_list"}


def test_mean_segments_and_distribution(capsys):
    assert round(run_json(capsys, "--mean-segments", "10")["r3_bytes"] / TIB, 1) == 23.4
    out = run_json(capsys, "--segments-distribution", "1:0.5,3:0.5")
    assert out["mean_segments"] == 2.0 and out["segments"] == 8192


def test_projection_and_thresholds_from_the_builtin_baseline(capsys):
    out = run_json(capsys, "--nodes", "32", "--host-memory", "2TB")
    proj = out["projection"]
    assert "seed" in proj["baseline"]
    assert proj["growth"]["cluster_r3"] == pytest.approx(7.5)
    assert proj["growth"]["local_storage_unit_r3"] == pytest.approx(0.46875)
    assert set(proj["with_tq"]["components"]) == {"proxy", "rollout_manager", "object_store",
                                                  "tq_controller", "tq_storage_unit_master"}
    host = out["host_memory"]
    assert host["bytes"] == 2 * 10**12
    assert not host["without_tq"]["fits"] and host["with_tq"]["fits"]
    assert host["without_tq"]["max_rollout_batch_size"] == int(host["without_tq"]["crossing_batch"])


def test_explicit_shape_without_preset(capsys):
    assert main(["capacity", "--num-layers", "75", "--topk", "8", "--num-experts", "256", "--context-length", "256K",
                 "--rollout-batch-size", "512", "--n-samples-per-prompt", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["r3_bytes"] == 2400 * 2**30


def test_text_output_and_plot(capsys, tmp_path):
    png = tmp_path / "peak.png"
    assert main([*GLM, "--nodes", "32", "--host-memory", "1.82TiB", "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "2.34 TiB" in text and "w/o TQ" in text and "largest rollout batch size" in text
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_baseline_file(capsys, tmp_path):
    from dressage.capacity import SEED_QWEN_BASELINE, baseline_to_dict

    path = tmp_path / "b.json"
    path.write_text(json.dumps(baseline_to_dict(SEED_QWEN_BASELINE)))
    from_file = run_json(capsys, "--baseline", str(path))["projection"]
    builtin = run_json(capsys)["projection"]
    assert from_file["without_tq"] == builtin["without_tq"] and from_file["with_tq"] == builtin["with_tq"]


@pytest.mark.parametrize("argv, needle", [
    ([*GLM[:-2], "--routed-experts-dtype", "uint8", "--model", "qwen3-next-80b-a3b"], "--routed-experts-dtype"),
    ([*GLM, "--host-memory", "lots"], "--host-memory"),
    ([*GLM, "--host-memory", "2XB"], "--host-memory"),
    ([*GLM, "--host-memory", "0"], "--host-memory"),
    ([*GLM, "--host-memory", "2"], "not a plausible master node"),
    ([*GLM, "--host-memory", "512MiB"], "not a plausible master node"),
    ([*GLM, "--context-length", "abc"], "--context-length"),
    ([*GLM, "--context-length", "0"], "--context-length"),
    ([*GLM, "--rollout-batch-size", "0"], "--rollout-batch-size"),
    ([*GLM, "--rollout-batch-size", "-4"], "--rollout-batch-size"),
    ([*GLM, "--n-samples-per-prompt", "1.5"], "--n-samples-per-prompt"),
    ([*GLM, "--nodes", "0"], "--nodes"),
    ([*GLM, "--nodes", "nan"], "--nodes"),
    ([*GLM, "--rollout-batch-size", "inf"], "--rollout-batch-size"),
    ([*GLM, "--mean-segments", "inf"], "--mean-segments"),
    ([*GLM, "--mean-segments", "nan"], "--mean-segments"),
    ([*GLM, "--message-bytes-per-token", "-3"], "--message-bytes-per-token"),
    ([*GLM, "--mean-segments", "0"], "--mean-segments"),
    ([*GLM, "--mean-segments", "many"], "--mean-segments"),
    ([*GLM, "--mean-segment-tokens", "300K"], "--mean-segment-tokens"),
    ([*GLM, "--segments-distribution", "1:x"], "--segments-distribution"),
    ([*GLM, "--topk", "0"], "--topk"),
    ([*GLM, "--baseline", "/nonexistent/baseline.json"], "--baseline"),
    (["capacity", "--context-length", "64K", "--rollout-batch-size", "8"], "--model"),
    (["capacity", "--model", "gpt-9", "--context-length", "64K", "--rollout-batch-size", "8"], "gpt-9"),
])
def test_bad_input_exits_non_zero_naming_the_flag(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("dressage capacity: error:") and needle in err


def test_baseline_missing_component_names_the_key(capsys, tmp_path):
    from dressage.capacity import SEED_QWEN_BASELINE, baseline_to_dict

    data = baseline_to_dict(SEED_QWEN_BASELINE)
    del data["with_tq"]["components"]["tq_controller"]
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    assert main([*GLM, "--baseline", str(path)]) == 2
    assert "baseline.with_tq.components.tq_controller is missing" in capsys.readouterr().err


def test_console_entry_point_exits_non_zero_for_a_narrow_dtype():
    proc = subprocess.run(
        [sys.executable, "-m", "dressage", "capacity", "--model", "qwen3-next-80b-a3b", "--context-length", "64K",
         "--rollout-batch-size", "8", "--routed-experts-dtype", "uint8"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0 and "uint8" in proc.stderr and "512 experts" in proc.stderr


def _small_baseline(tmp_path):
    """A memory run of 4 trajectories of 4K tokens: its peaks are mostly fixed costs."""
    from dressage.capacity import SEED_QWEN_BASELINE, baseline_to_dict

    data = baseline_to_dict(SEED_QWEN_BASELINE)
    data["config"].update(context_length=4096, rollout_batch_size=2, n_samples_per_prompt=2)
    gib = 2**30
    data["without_tq"] = {"master_peak_bytes": 3 * gib,
                          "components": {"proxy": gib, "rollout_manager": gib, "object_store": gib}}
    data["with_tq"] = {"master_peak_bytes": 3 * gib,
                       "components": {"proxy": gib, "rollout_manager": gib, "object_store": gib // 2,
                                      "tq_controller": 0, "tq_storage_unit_master": gib // 2}}
    path = tmp_path / "small.json"
    path.write_text(json.dumps(data))
    return path


def test_a_projection_from_a_far_smaller_baseline_says_so(capsys, tmp_path):
    path = _small_baseline(tmp_path)
    proj = run_json(capsys, "--baseline", str(path), "--host-memory", "2TB")["projection"]
    assert proj["growth"]["tokens"] > 100
    (warning,) = proj["warnings"]
    assert "the baseline is far smaller than the target (tokens x" in warning and "leave out --baseline" in warning
    assert main([*GLM, "--baseline", str(path), "--host-memory", "2TB"]) == 0
    text = capsys.readouterr().out
    assert text.rstrip().endswith(f"warning: {warning}")


def test_a_projection_from_the_seed_figures_warns_of_nothing(capsys):
    assert run_json(capsys, "--host-memory", "2TB")["projection"]["warnings"] == []
    assert main([*GLM, "--host-memory", "2TB"]) == 0
    assert "warning" not in capsys.readouterr().out


def test_sizes_from_1000_to_1023_of_a_unit_print_as_whole_numbers():
    from dressage.units import format_bytes

    assert format_bytes(1010 * 2**30) == "1010 GiB"
    assert format_bytes(999.7 * 2**30) == "1000 GiB"
    assert format_bytes(2.34 * 2**40) == "2.34 TiB" and format_bytes(512) == "512 B"
    assert all("e+" not in format_bytes(x * 2**30) for x in range(990, 1024))
