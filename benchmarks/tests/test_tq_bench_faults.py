"""The TransferQueue cases of ``dressage bench faults`` pass at small sizes and leave nothing running."""

from __future__ import annotations

import psutil
import pytest

from dressage_bench.faults import cases_tq  # noqa: F401  (registers the cases)
from dressage_bench.faults.runner import CASES, FaultsConfig


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize("name", ["corrupted_blob", "backpressure_spill", "wire_fuzz", "storage_unit_killed"])
def test_tq_fault_case_passes_and_cleans_up(name):
    before = _children()
    passed, detail = CASES[name](FaultsConfig(quick=True, fuzz_inputs=40))
    assert passed, detail
    if name == "wire_fuzz":
        assert detail["fuzz"]["wire_inputs"] >= 40 and detail["fuzz"]["wire_untyped_errors"] == 0
    if name == "storage_unit_killed":
        assert detail["reader_dropped_exactly_affected"] and detail["new_puts_on_victim"] == 0
    assert _children() <= before
