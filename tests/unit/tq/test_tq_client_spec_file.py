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
])
def test_a_file_that_is_not_a_spec_is_a_config_error_naming_it(tmp_path, content, needle):
    path = tmp_path / "tq.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=needle) as info:
        load_client_spec(path)
    assert "tq.json" in str(info.value)


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
