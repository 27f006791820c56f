"""The fast cases of ``dressage bench faults`` run in CI: faults injected, nothing lost, no 5xx from input."""

import json

from dressage_bench.faults import FaultsConfig, run_faults
from dressage.cli import main


def test_engine_and_proxy_fault_cases_pass():
    report = run_faults(FaultsConfig(quick=True, only=("engine_down_mid_session", "engine_timeout_mid_session",
                                                       "proxy_restart_from_journal", "proxy_kill9_restart")))
    by_name = {c["name"]: c for c in report["cases"]}
    assert all(c["passed"] for c in report["cases"]), by_name
    restart = by_name["proxy_restart_from_journal"]["detail"]
    assert restart["identical_after_replay"] is True
    assert restart["steps_after_replay"] == restart["steps_committed_before_crash"]
    assert by_name["engine_down_mid_session"]["detail"]["steps_after_failed_call"] == 1


def test_http_fuzz_finds_no_server_errors(tmp_path, bench_command):
    out = tmp_path / "faults.json"
    rc = main(["bench", "faults", "--quick", "--cases", "http_fuzz", "--fuzz-inputs", "120", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["fuzz"]["inputs"] == 120 and data["fuzz"]["server_errors"] == 0, data
    assert rc == 0
    case = data["cases"][0]
    assert case["detail"]["healthy_after"] and case["detail"]["valid_call_after"] == 200
    assert "413" in case["detail"]["statuses"]          # the body-size limit was enforced


def test_short_soak_leaves_no_keys_and_no_sessions():
    report = run_faults(FaultsConfig(quick=True, only=("soak",), soak_iterations=6))
    soak = report["soak"]
    assert soak["iterations"] == 6 and soak["keys_left"] == 0
    assert soak["proxy_sessions_held_max"] == 0 and soak["open_fds_growth"] <= 2
