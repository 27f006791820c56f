"""The weight-version policy without HTTP: codes, their order, names kept, and a journal restart."""

from types import SimpleNamespace

import numpy as np
import pytest

from dressage.errors import ConfigError
from dressage.fields import NAMED_BASE, VersionTable
from dressage.proxy.recording.weights import STEP_LABELS_KEY, WeightVersions
from dressage.trajectory.sample import VERSION_LABELS_KEY, Sample


def test_codes_order_numbers_as_numbers_and_names_by_first_sight():
    versions = WeightVersions()
    codes = [versions.stamp(v, 0) for v in ("2", "10", "rl-b", "rl-a", "rl-b", "11")]
    assert codes[:2] == [2, 10] and codes[2] == codes[4] == NAMED_BASE and codes[3] == NAMED_BASE + 1
    assert codes[5] == 11 and versions.current == 11       # the engine's latest answer is current
    # Names are newer than every number and than the names before them.
    assert sorted(set(codes)) == [2, 10, 11, NAMED_BASE, NAMED_BASE + 1]
    assert versions.labels(codes) == {str(NAMED_BASE): "rl-b", str(NAMED_BASE + 1): "rl-a"}


def test_a_restored_table_gives_new_names_codes_above_the_recorded_ones():
    table = VersionTable()
    table.restore("rl-7", NAMED_BASE + 4)
    table.restore("rl-7", NAMED_BASE + 4)                  # the same fact twice is fine
    assert table.code("rl-7") == NAMED_BASE + 4 and table.code("rl-8") == NAMED_BASE + 5
    for version, code in (("rl-7", NAMED_BASE), ("other", NAMED_BASE + 4), ("12", NAMED_BASE + 9), ("x", 3)):
        with pytest.raises(ConfigError):
            table.restore(version, code)
    assert table.named() == {"rl-7": NAMED_BASE + 4, "rl-8": NAMED_BASE + 5}


def test_restore_takes_back_names_the_newest_version_and_session_pins():
    code = NAMED_BASE + 2
    step = SimpleNamespace(metadata={STEP_LABELS_KEY: {str(code): "rl-3"}}, token_versions=np.array([code, code]))
    old = SimpleNamespace(metadata={}, token_versions=np.array([1, 1]))
    sessions = [SimpleNamespace(session_id="a", state="active", steps={0: old, 1: step}),
                SimpleNamespace(session_id="b", state="finalized", steps={0: step})]
    versions = WeightVersions()
    versions.restore(sessions)
    assert versions.table.label(code) == "rl-3" and versions.current == code and versions.label == "rl-3"
    assert versions._pins == {"a": 1}                      # the active session keeps its first version
    assert versions.table.code("rl-4") == code + 1


def test_sample_weight_versions_are_the_engine_strings():
    code = NAMED_BASE
    sample = Sample(tokens=np.arange(6, dtype=np.int32), response_length=4, loss_mask=np.array([1, 1, 0, 1]),
                    token_versions=np.array([3, 3, 5, code], dtype=np.int32),
                    metadata={VERSION_LABELS_KEY: {str(code): "rl-step-9"}})
    assert sample.weight_versions == ["3", "rl-step-9"]    # the masked token's version 5 is not trained
