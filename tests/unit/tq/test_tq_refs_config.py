"""FieldRef (narrowing, wire form, pickling) and TransferQueueConfig validation."""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path

import msgpack
import numpy as np
import pytest
import yaml

from dressage.errors import ConfigError, ProtocolError, RowRangeError
from dressage.tq import FieldRef, TransferQueueConfig
from dressage.tq.config import EXAMPLE_CONFIG, load_config


def make_ref(**kw):
    base = dict(key="k", unit_id="unit0", field="routed_experts", dtype="uint8", shape=(100, 40, 8))
    base.update(kw)
    return FieldRef(**base)


def test_ref_defaults_cover_the_whole_blob_and_size_follows_rows():
    ref = make_ref()
    assert (ref.row_start, ref.row_stop, ref.num_rows) == (0, 100, 100)
    assert ref.nbytes == 100 * 40 * 8 and ref.is_whole


def test_narrow_is_relative_and_composes():
    ref = make_ref().narrow(10, 50).narrow(5, 15)
    assert (ref.row_start, ref.row_stop, ref.num_rows, ref.nbytes) == (15, 25, 10, 10 * 320)
    assert ref.shape == (100, 40, 8)


@pytest.mark.parametrize("start,stop", [(-1, 3), (5, 4), (0, 101)])
def test_narrow_outside_the_ref_is_row_range_error(start, stop):
    with pytest.raises(RowRangeError):
        make_ref().narrow(start, stop)
    with pytest.raises(RowRangeError):
        make_ref(row_start=10, row_stop=20).narrow(0, 11)


def test_ref_constructor_rejects_rows_outside_the_shape():
    with pytest.raises(RowRangeError):
        make_ref(row_start=0, row_stop=101)


def test_ref_is_frozen_hashable_picklable_and_msgpack_round_trips():
    ref = make_ref(batch="step-3").narrow(1, 7)
    with pytest.raises(AttributeError):
        ref.key = "other"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(ref)) == ref
    wire = msgpack.unpackb(msgpack.packb(ref.to_wire()), raw=False)
    assert FieldRef.from_wire(wire) == ref and hash(FieldRef.from_wire(wire)) == hash(ref)
    assert len({ref, FieldRef.from_wire(wire)}) == 1


def _wire(dtype="float32", shape=(3,), start=0, stop=None, batch=None):
    return ["fref1", "k", "u", "f", dtype, list(shape), start, stop, batch]


@pytest.mark.parametrize("bad", [
    None, [], ["x"] * 9, ["fref1", 1, "u", "f", "uint8", [3], 0, 3, None],
    ["fref1", "k", "u", "f", "uint8", "3", 0, 3, None],
    _wire(start="a"), _wire(start=None), _wire(start=[1]), _wire(start=True), _wire(start=0.0),
    _wire(stop=2.7), _wire(stop=False), _wire(stop=-1),
    _wire(batch=5), _wire(batch=b"b"),
    _wire(dtype="object"), _wire(dtype="U8"), _wire(dtype="V4"), _wire(dtype="flt"), _wire(dtype="i4,i4"),
    _wire(shape=[True]), _wire(shape=[10 ** 30]), _wire(shape=[1 << 63]), _wire(shape=[]), _wire(shape=[3, -1]),
    _wire(shape=[3.0]),
])
def test_bad_ref_wire_forms_are_protocol_errors(bad):
    with pytest.raises(ProtocolError):
        FieldRef.from_wire(bad)


def test_ref_wire_forms_at_the_bounds_are_accepted():
    big = (1 << 63) - 1
    ref = FieldRef.from_wire(_wire(dtype="bool", shape=[big, 0], start=big - 1, stop=big, batch=""))
    assert (ref.shape, ref.row_start, ref.row_stop, ref.batch, ref.nbytes) == ((big, 0), big - 1, big, "", 0)
    assert FieldRef.from_wire(_wire(dtype="complex64", shape=[0, 4, 2])).num_rows == 0
    with pytest.raises(RowRangeError):  # integers, but rows past the shape: as the constructor says
        FieldRef.from_wire(_wire(start=2, stop=4))


def test_config_defaults_and_byte_sizes():
    cfg = TransferQueueConfig()
    assert cfg.deployment == "embedded" and cfg.on_full == "spill" and cfg.host == "127.0.0.1"
    assert cfg.budget_bytes == 4 << 30
    assert TransferQueueConfig(unit_memory_budget="512MiB").budget_bytes == 512 << 20


@pytest.mark.parametrize("key,value", [
    ("deployment", "k8s"), ("on_full", "drop"), ("num_storage_units", 0), ("num_storage_units", True),
    ("unit_memory_budget", "lots"), ("unit_memory_budget", -1), ("retention_s", -5), ("retention_s", "1h"),
    ("request_timeout_s", 0), ("controller_port", 70000), ("unit_base_port", -1), ("host", "a b"),
])
def test_bad_values_name_the_dotted_key(key, value):
    with pytest.raises(ConfigError, match=rf"transfer_queue\.{key}"):
        TransferQueueConfig.from_dict({key: value})


def test_unknown_key_is_rejected_by_name(tmp_path):
    path = tmp_path / "tq.yaml"
    path.write_text("transfer_queue:\n  deployment: local\n  num_units: 3\n")
    with pytest.raises(ConfigError, match=r"transfer_queue\.num_units: unknown key"):
        TransferQueueConfig.from_yaml(path)


def test_yaml_loads_nested_or_flat(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text("deployment: local\nnum_storage_units: 2\nunit_memory_budget: 1GiB\nretention_s: null\n")
    cfg = load_config(flat)
    assert (cfg.deployment, cfg.num_storage_units, cfg.budget_bytes, cfg.retention_s) == ("local", 2, 1 << 30, None)


def test_shipped_example_config_is_valid_and_matches_the_repository_copy():
    cfg = TransferQueueConfig.from_yaml(EXAMPLE_CONFIG)
    assert cfg == TransferQueueConfig()  # the example spells out the defaults
    listed = set(yaml.safe_load(EXAMPLE_CONFIG.read_text())["transfer_queue"])
    assert listed == {f.name for f in dataclasses.fields(TransferQueueConfig)}  # ... every one of them
    repo_copy = Path(__file__).resolve().parents[3] / "examples" / "transfer_queue.yaml"
    assert repo_copy.read_text() == EXAMPLE_CONFIG.read_text()


@pytest.mark.parametrize("key,value,needle", [
    ("unit_memory_budget", float("nan"), "finite"), ("unit_memory_budget", float("inf"), "finite"),
    ("unit_memory_budget", "1e400", "finite"), ("unit_memory_budget", 10**400, "finite"),
    ("unit_memory_budget", "1e308PiB", "too large"), ("unit_memory_budget", "2PiB", "at most 1 PiB"),
    ("request_timeout_s", 1e12, "at most"), ("startup_timeout_s", 1e9, "at most"),
    ("full_wait_s", 1e15, "at most"), ("retention_s", 1e12, "at most"),
    ("host", "::1", "IPv6"), ("host", "fe80::1", "IPv6"), ("spill_dir", "", "directory path"),
])
def test_values_that_would_only_fail_at_start_are_refused_naming_the_key(key, value, needle):
    with pytest.raises(ConfigError, match=rf"transfer_queue\.{key}: .*{needle}"):
        TransferQueueConfig.from_dict({key: value})


def test_heartbeats_and_retention_are_bounded_but_a_week_or_a_year_is_fine():
    with pytest.raises(ConfigError, match=r"transfer_queue\.heartbeat_interval_s: at most 604800"):
        TransferQueueConfig(heartbeat_interval_s=1e12, unit_dead_after_s=1e12)
    cfg = TransferQueueConfig(heartbeat_interval_s=7 * 86400, unit_dead_after_s=7 * 86400, request_timeout_s=86400,
                              retention_s=365 * 86400)
    assert cfg.retention_s == 365 * 86400


@pytest.mark.parametrize("settings,key", [
    ({"num_storage_units": 2, "unit_base_port": 65535}, "unit_base_port"),
    ({"num_storage_units": 8, "unit_base_port": 65530}, "unit_base_port"),
    ({"metrics_port": 65535}, "metrics_port"),
    ({"num_storage_units": 3, "metrics_port": 65533}, "metrics_port"),
])
def test_ports_counted_from_a_base_must_all_be_ports(settings, key):
    with pytest.raises(ConfigError, match=rf"transfer_queue\.{key}: .*past 65535"):
        TransferQueueConfig.from_dict({"deployment": "local", **settings})


def test_ports_up_to_65535_are_fine():
    TransferQueueConfig(num_storage_units=2, unit_base_port=65534, metrics_port=65532)
    TransferQueueConfig(num_storage_units=4, unit_base_port=0, metrics_port=0)


@pytest.mark.parametrize("deployment", ["embedded", "local"])
def test_a_spill_dir_that_cannot_be_made_or_is_a_file_is_refused_before_anything_starts(tmp_path, deployment):
    from dressage.tq import TransferQueue

    a_file = tmp_path / "blobs"
    a_file.write_text("not a directory")
    for spill_dir, needle in ((str(a_file), "not a directory"), (str(a_file / "sub"), "cannot create"),
                              ("/proc/dressage-nonexistent", "cannot create")):
        with pytest.raises(ConfigError, match=r"transfer_queue\.spill_dir: .*" + needle):
            TransferQueue.start({"deployment": deployment, "spill_dir": spill_dir})
    made = tmp_path / "new" / "spill"
    with TransferQueue.start({"deployment": "embedded", "spill_dir": str(made)}) as tq:
        assert made.is_dir() and os.listdir(made) == ["unit0"]  # the write probe leaves nothing behind
        tq.client().put("x", np.ones(3, np.float32))


def test_a_spill_dir_is_not_checked_when_nothing_spills():
    from dressage.tq import TransferQueue

    with TransferQueue.start({"spill_dir": "/proc/dressage-nonexistent", "on_full": "error"}) as tq:
        assert tq.client().total_keys() == 0


def test_a_startup_timeout_that_runs_out_says_so_naming_the_key():
    from dressage.errors import StorageUnitUnavailable
    from dressage.tq import TransferQueue

    with pytest.raises(StorageUnitUnavailable, match=r"not ready within 0\.001 s.*transfer_queue\.startup_timeout_s"):
        TransferQueue.start({"deployment": "local", "startup_timeout_s": 0.001})
