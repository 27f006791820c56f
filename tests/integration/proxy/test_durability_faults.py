"""The ``dressage bench faults`` durability cases in their quick form: each passes with no acknowledged
trajectory lost (a poisoned drain, a full journal disk under finalize / abort / discard / drain, a
byte flipped mid-journal)."""

from __future__ import annotations

import pytest

from dressage_bench.faults.runner import CASES, FaultsConfig, load_cases

load_cases()


@pytest.mark.parametrize("name", ["poisoned_drain", "journal_disk_full", "journal_mid_flip"])
def test_durability_fault_case_passes_losing_nothing_acknowledged(name):
    passed, detail = CASES[name](FaultsConfig(quick=True, only=(name,)))
    assert detail["acknowledged_lost"] == 0, detail
    assert passed, detail
