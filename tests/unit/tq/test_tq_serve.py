"""``dressage tq serve``: a TransferQueue as its own service. Its clients come and go (a Proxy restarted)
and lose nothing; its spec is owner-only and goes away with it."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from dressage.errors import ConfigError
from dressage.tq import TransferQueueClient
from dressage.tq.client.spec import check_controller, load_client_spec
from dressage.tq.deploy.service import TqServeConfig


def _wait_for_file(path, proc, what: str) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        assert proc.poll() is None, f"dressage tq serve exited: {proc.stderr.read()}"
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_served_tq_keeps_every_key_across_its_clients_and_removes_its_spec_when_stopped(tmp_path):
    config = tmp_path / "tq.yaml"
    config.write_text("transfer_queue:\n  deployment: local\n  num_storage_units: 2\n"
                      "  unit_memory_budget: 32MiB\n  retention_s: null\n")
    spec_path = tmp_path / "run" / "tq-spec.json"
    proc = subprocess.Popen([sys.executable, "-m", "dressage", "tq", "serve", "--config", str(config),
                             "--spec-out", str(spec_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_file(spec_path, proc, "the spec was not written")
        line = proc.stdout.readline()
        assert "serving a local TransferQueue" in line and "2 StorageUnit(s)" in line
        assert stat.S_IMODE(os.stat(spec_path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(spec_path.parent).st_mode) == 0o700
        spec = load_client_spec(spec_path)
        assert spec.get("auth_secret")
        assert check_controller(spec) > 0
        # A first client (a Proxy) writes, then goes away as a restarted Proxy's would.
        arrays = [np.random.default_rng(i).standard_normal((500 + i, 4)).astype(np.float32) for i in range(12)]
        first = TransferQueueClient.connect(spec)
        refs = [first.put("logprobs", a) for a in arrays]
        first.close()
        # The next one (the Proxy started again, or a trainer) reads every key back.
        second = TransferQueueClient.connect(load_client_spec(spec_path))
        try:
            assert second.total_keys() == len(refs)
            for a, b in zip(arrays, second.get_many(refs, copy=True)):
                np.testing.assert_array_equal(a, b)
        finally:
            second.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not spec_path.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_tq_serve_settings_default_to_a_local_deployment_and_the_flag_overrides_the_file(tmp_path):
    assert TqServeConfig(spec_out="s.json").settings().deployment == "local"
    config = tmp_path / "tq.yaml"
    config.write_text("deployment: embedded\nnum_storage_units: 3\n")
    assert TqServeConfig(config=str(config), spec_out="s.json").settings().deployment == "embedded"
    cfg = TqServeConfig(config=str(config), deployment="local", spec_out="s.json").settings()
    assert (cfg.deployment, cfg.num_storage_units) == ("local", 3)
    for text in ("num_storage_units: 3\n", "transfer_queue:\n  num_storage_units: 3\n"):  # the file names none
        config.write_text(text)
        cfg = TqServeConfig(config=str(config), spec_out="s.json").settings()
        assert (cfg.deployment, cfg.num_storage_units) == ("local", 3)
    config.write_text("transfer_queue:\n  deployment: embedded\n")
    assert TqServeConfig(config=str(config), spec_out="s.json").settings().deployment == "embedded"
    with pytest.raises(ConfigError, match="spec_out"):
        TqServeConfig(spec_out="")


def test_tq_serve_without_spec_out_is_a_usage_error_naming_the_flag():
    proc = subprocess.run([sys.executable, "-m", "dressage", "tq", "serve"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--spec-out" in proc.stderr


@pytest.mark.parametrize("spec_out", ["DIR", "/proc/dressage-nope/spec.json"])
def test_tq_serve_refuses_a_spec_out_it_cannot_write_before_starting_anything(tmp_path, spec_out):
    spec_out = str(tmp_path) if spec_out == "DIR" else spec_out
    proc = subprocess.run([sys.executable, "-m", "dressage", "tq", "serve", "--spec-out", spec_out],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("dressage tq: error: TransferQueue client spec") and spec_out in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""  # nothing was served
