"""The TransferQueue cases of ``dressage bench faults`` pass at small sizes and leave nothing running."""

from __future__ import annotations

import psutil
import pytest

from dressage_bench.faults.runner import CASES, FaultsConfig, load_cases

load_cases()  # registers every case


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize("name", ["corrupted_blob", "backpressure_spill", "wire_fuzz", "storage_unit_killed",
                                  "controller_killed", "unauthenticated_large_sizes",
                                  "proxy_restart_tq_served_apart", "backpressure_wait", "storage_unit_stopped"])
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


def test_every_faults_case_is_run_by_a_test():
    # Each case runs in its quick form in exactly the tests that check its figures; running them all
    # again through run_faults would only repeat them. This keeps a newly registered case from going
    # untested: its name must appear in a test that runs it.
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = "\n".join(p.read_text() for d in ("tests", "benchmarks/tests") for p in (root / d).rglob("test_*.py")
                     if p.resolve() != Path(__file__).resolve())
    text += Path(__file__).read_text().split("def test_every_faults_case_is_run_by_a_test")[0]
    untested = sorted(n for n in CASES if f'"{n}"' not in text)
    assert not untested, untested
