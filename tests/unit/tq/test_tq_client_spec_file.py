"""A TransferQueue's client spec as a file: written for its owner only, read back exactly, and every
way a file can be wrong is a ConfigError that names it; the Proxy's flag for it is checked up front."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from dressage.errors import ConfigError
from dressage.proxy.config import DataPlaneConfig, ProxyConfig, TransferQueueSelection
from dressage.tq import TransferQueue
from dressage.tq.client.spec import SPEC_VERSION, load_client_spec, write_client_spec


def test_a_written_spec_reads_back_and_only_its_owner_can_read_it(tmp_path):
    with TransferQueue.start({"deployment": "embedded"}) as tq:
        path = tmp_path / "tq.json"
        tq.write_client_spec(path)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert load_client_spec(path) == json.loads(json.dumps(tq.client_spec()))
        assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]  # replaced in one step


@pytest.mark.parametrize("content, needle", [
    (None, "No such file"),
    ("not json", "is not JSON"),
    ('{"spec_version": 99, "controller": "tcp://x:1"}', "not a spec of version"),
    ('{"spec_version": 1}', "not a spec of version"),
    ("[1, 2]", "not a spec of version"),
    ('{"spec_version": 1, "controller": 7, "units": []}', "controller: expected an address"),
    ('{"spec_version": 1, "controller": "tcp://127.0.0.1:9", "units": [{"unit_id": "u0", "address": 5, '
     '"memory_budget": 1}]}', r"units\[0\]\.address: expected an address"),
    ('{"spec_version": 1, "controller": "tcp://127.0.0.1:9", "units": [{"unit_id": "u0", "address": '
     '"tcp://127.0.0.1:9", "memory_budget": "big"}]}', r"units\[0\]\.memory_budget: expected bytes"),
    ('{"spec_version": 1, "controller": "tcp://127.0.0.1:9", "units": [{"unit_id": "u0", "address": '
     '"tcp://127.0.0.1:9", "memory_budget": 1}], "request_timeout_s": "soon"}', "request_timeout_s: expected"),
    ('{"spec_version": 1, "controller": "tcp://127.0.0.1:9", "units": [{"unit_id": "u0", "address": '
     '"tcp://127.0.0.1:9", "memory_budget": 1}], "auth_secret": 12}', "auth_secret: expected a string"),
])
def test_a_file_that_is_not_a_spec_is_a_config_error_naming_it(tmp_path, content, needle):
    path = tmp_path / "tq.json"
    if content is not None:
        path.write_text(content)
        path.chmod(0o600)
    with pytest.raises(ConfigError, match=needle) as info:
        load_client_spec(path)
    assert "tq.json" in str(info.value)


def test_a_spec_nested_too_deeply_is_a_config_error_naming_it(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000)
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="deep.json.*not JSON"):
        load_client_spec(path)


def test_a_spec_path_that_cannot_be_written_is_a_config_error_naming_it(tmp_path):
    from dressage.tq.client.spec import check_spec_path

    spec = {"spec_version": SPEC_VERSION, "controller": "tcp://127.0.0.1:9"}
    for path, needle in ((tmp_path, "is a directory"), ("/proc/dressage-nope/spec.json", "cannot write it")):
        with pytest.raises(ConfigError, match=needle) as info:
            write_client_spec(spec, path)
        assert str(path) in str(info.value)
        with pytest.raises(ConfigError, match=needle):
            check_spec_path(path)
    # A path that can be written passes the check and leaves nothing behind, not even its folders.
    check_spec_path(tmp_path / "a" / "b" / "spec.json")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("key", ["request_timeout_s", "full_wait_s"])
def test_a_spec_timeout_past_a_week_is_refused_before_any_socket_opens(key):
    from dressage.tq import TransferQueueClient

    spec = {"spec_version": 1, "controller": "tcp://127.0.0.1:9", key: 1e15,
            "units": [{"unit_id": "u0", "address": "tcp://127.0.0.1:9", "memory_budget": 1}]}
    with pytest.raises(ConfigError, match=f"{key}: .*at most 604800"):
        TransferQueueClient.connect(spec)


def test_only_a_spec_is_written():
    with pytest.raises(ConfigError, match="not a TransferQueue client spec"):
        write_client_spec({"controller": "tcp://x:1"}, "/nonexistent/tq.json")
    assert SPEC_VERSION == 1


def test_the_proxy_joins_a_spec_only_with_tq_on_and_never_also_starts_one():
    with pytest.raises(ConfigError, match=r"transfer_queue\.spec .*enable_transfer_queue .* is off"):
        ProxyConfig(transfer_queue=TransferQueueSelection(spec="tq.json"))
    with pytest.raises(ConfigError, match=r"cannot go with transfer_queue\.config \(--transfer-queue-config\)"):
        TransferQueueSelection(config="tq.yaml", spec="tq.json")
    ok = ProxyConfig(data_plane=DataPlaneConfig(enable_transfer_queue=True),
                     transfer_queue=TransferQueueSelection(spec="tq.json"))
    assert ok.transfer_queue.spec == "tq.json"


def test_a_process_outside_ray_learns_it_has_no_node_without_importing_ray():
    code = ("import sys; from dressage.tq.client.node import current_node_id; "
            "assert current_node_id() is None; assert 'ray' not in sys.modules, 'ray was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_a_spec_its_group_or_others_can_read_is_refused(tmp_path, mode):
    with TransferQueue.start({"deployment": "embedded"}) as tq:
        path = tmp_path / "tq.json"
        tq.write_client_spec(path)
        path.chmod(mode)
        with pytest.raises(ConfigError, match=f"readable by its group or others .*mode {mode:04o}.*chmod 600"):
            load_client_spec(path)
        path.chmod(0o600)
        assert load_client_spec(path)["controller"] == tq.client_spec()["controller"]


def test_a_spec_is_written_0600_into_a_0700_directory_made_for_it(tmp_path):
    with TransferQueue.start({"deployment": "embedded"}) as tq:
        path = tmp_path / "specs" / "run" / "tq.json"
        old = os.umask(0o022)
        try:
            tq.write_client_spec(path)
        finally:
            os.umask(old)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


def test_a_malformed_spec_value_is_a_one_line_config_error_before_any_socket_opens():
    from dressage.tq import TransferQueueClient

    spec = {"spec_version": 1, "controller": "tcp://127.0.0.1:9", "units": [
        {"unit_id": "u0", "address": ["tcp://127.0.0.1:9"], "memory_budget": 1}]}
    with pytest.raises(ConfigError, match=r"units\[0\]\.address") as info:
        TransferQueueClient.connect(spec)
    assert "\n" not in str(info.value)


def test_a_spec_whose_controller_does_not_answer_is_refused_at_start_within_the_check_timeout():
    import socket

    from dressage.tq.client.spec import check_controller

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = {"spec_version": 1, "controller": f"tcp://127.0.0.1:{port}", "units": [
        {"unit_id": "u0", "address": f"tcp://127.0.0.1:{port}", "memory_budget": 1}]}
    with pytest.raises(ConfigError, match=r"does not answer within 0\.5 s.*dressage tq serve"):
        check_controller(spec, timeout_s=0.5)
    with TransferQueue.start({"deployment": "local", "unit_memory_budget": "16MiB"}) as tq:
        assert check_controller(tq.client_spec(), timeout_s=5) == tq.processes()["controller"]
