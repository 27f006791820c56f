"""The TransferQueue cases of ``dressage bench faults`` pass at small sizes and leave nothing running."""

from __future__ import annotations

import psutil
import pytest

from dressage_bench.faults import cases_tq, cases_tq_service  # noqa: F401  (registers the cases)
from dressage_bench.faults.runner import CASES, FaultsConfig, load_cases, run_faults


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize("name", ["corrupted_blob", "backpressure_spill", "wire_fuzz", "storage_unit_killed",
                                  "controller_killed", "unauthenticated_large_sizes",
                                  "proxy_restart_tq_served_apart"])
def test_tq_fault_case_passes_and_cleans_up(name):
    before = _children()
    passed, detail = CASES[name](FaultsConfig(quick=True, fuzz_inputs=40))
    assert passed, detail
    if name == "wire_fuzz":
        assert detail["fuzz"]["wire_inputs"] >= 40 and detail["fuzz"]["wire_untyped_errors"] == 0
    if name == "storage_unit_killed":
        assert detail["reader_dropped_exactly_affected"] and detail["new_puts_on_victim"] == 0
    if name == "controller_killed":  # every acknowledged put readable after the Controller came back
        assert detail["acknowledged_lost"] == 0 and detail["restored_samples"] == detail["acknowledged_puts"]
        assert detail["acknowledged_puts"] > detail["acknowledged_before_kill"] and detail["controller_pid_changed"]
    if name == "unauthenticated_large_sizes":  # memory bounded by the cap, not by the declared sizes
        assert detail["declared_bytes"] > 1 << 30 and detail["unit_memory_growth"] < detail["cap_bytes"]
        assert detail["bulk_heads_refused"] >= detail["declarations"]
    if name == "proxy_restart_tq_served_apart":  # the standalone recipe: a SIGKILLed Proxy loses nothing
        assert detail["acknowledged_lost"] == 0 and detail["large_fields_lost"] == 0 and detail["keys_left"] == 0
        assert detail["bit_identical_to_before_kill"] and detail["logprobs_match_answers"]
        assert detail["samples_compared"] == detail["sessions_finalized_before_kill"] > 0
        sessions = detail["sessions_finalized_before_kill"] + detail["sessions_active_at_kill"]
        assert detail["reads_acknowledged"] == sessions and not detail["unread_sessions"]
        assert detail["tq_keys_released"] == detail["tq_keys_read"] > 0 and detail["tq_serve_exit_code"] == 0
    assert _children() <= before


@pytest.mark.ray
def test_storage_unit_killed_on_ray_passes():
    pytest.importorskip("ray")
    before = _children()
    passed, detail = CASES["storage_unit_killed_ray"](FaultsConfig(quick=True))
    assert passed, detail
    assert detail["units"] == 2 and detail["new_puts_on_victim"] == 0 and detail["new_puts"] > 0
    assert _children() <= before


@pytest.mark.slow
@pytest.mark.ray
def test_every_faults_case_passes_in_its_quick_form():
    load_cases()
    report = run_faults(FaultsConfig(quick=True))
    failed = {c["name"]: c["detail"] for c in report["cases"] if not c["passed"]}
    assert {c["name"] for c in report["cases"]} == set(CASES)
    assert not failed, failed
