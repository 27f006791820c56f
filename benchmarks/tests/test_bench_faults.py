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


def test_unbounded_engine_answers_are_cut_within_the_cap_and_the_timeout():
    report = run_faults(FaultsConfig(quick=True, only=("engine_keepalive_stream", "engine_huge_answer")))
    by_name = {c["name"]: c for c in report["cases"]}
    assert all(c["passed"] for c in report["cases"]), by_name
    keepalive = by_name["engine_keepalive_stream"]["detail"]
    assert keepalive["streamed_status"] == keepalive["plain_status"] == 504
    assert keepalive["steps_recorded"] == 1 and keepalive["valid_call_after"] == 200
    huge = by_name["engine_huge_answer"]["detail"]
    assert set(huge["answers"].values()) == {"502 engine_answer_too_large"} and huge["steps_recorded"] == 0
    assert huge["rss_growth_mib"] < 4 * huge["cap_mib"] < huge["declared_mib"]


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


def test_hostile_input_engine_client_token_and_state_cases_pass():
    names = ("hostile_inputs", "hostile_engine", "body_limit_chunked", "slowloris", "access_tokens", "session_caps")
    report = run_faults(FaultsConfig(quick=True, only=names))
    by_name = {c["name"]: c for c in report["cases"]}
    assert all(c["passed"] for c in report["cases"]), by_name
    assert by_name["hostile_inputs"]["detail"]["not_4xx_or_recorded"] == 0
    assert set(by_name["hostile_engine"]["detail"]["plain_statuses"].values()) == {502}
    assert by_name["body_limit_chunked"]["detail"]["chunked_100MiB"] == 413
    assert by_name["slowloris"]["detail"]["closed_by_server"] == 50
    assert by_name["session_caps"]["detail"]["sessions_held_at_cap"] == 100


def test_schemathesis_over_the_openapi_schema_finds_no_server_errors():
    import pytest

    pytest.importorskip("schemathesis")
    report = run_faults(FaultsConfig(quick=True, only=("schema_fuzz",), schema_cases=150))
    schema = report["schema"]
    assert schema["schemathesis_cases"] >= 150 and schema["operations"] >= 15, schema
    assert schema["server_errors"] == 0 and schema["transport_errors"] == 0, schema["examples_of_5xx"]
    assert schema["healthy_after"] and report["failed"] == 0


def test_load_reports_the_proxys_own_share_of_each_call():
    from dressage_bench.faults.load import _engine_wait_s

    assert _engine_wait_s("engine;dur=12.500") == 0.0125
    report = run_faults(FaultsConfig(quick=True, only=("load",), load_sessions=4, load_rounds=2))
    load = report["load"]
    # Latencies pooled over the timed rounds; the untimed warm-up round reports its own percentiles.
    assert report["failed"] == 0 and load["rounds"] == 2 and load["calls"] == 24 and load["sdk"]["calls"] == 12, load
    assert 0 < load["cold_proxy_p50_ms"] <= load["cold_proxy_p99_ms"]
    # The engine wait the Proxy reports is inside each call's latency, so its own share is smaller.
    assert 0 < load["proxy_own_p50_ms"] < load["proxy_p50_ms"]
    assert load["driver_cpu_ms_per_call"] > 0 and load["sdk"]["driver_cpu_ms_per_call"] > 0
