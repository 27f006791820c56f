"""The documented multi-process path: engine, Proxy (with a local-process TQ) and trainer are separate
processes; the trainer gets FieldRefs over HTTP and the large fields straight from the StorageUnits."""

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
import time

import httpx
import pytest

from dressage.harness.agents import AgentConfig, make_prompts, run_rollout

pytestmark = pytest.mark.slow
N_PROMPTS, N_SAMPLES = 3, 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args, url, env=None):
    proc = subprocess.Popen([sys.executable, "-m", "dressage", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, text=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{args[:2]} did not start:\n{proc.stdout.read()}")
        time.sleep(0.1)


def _stop(proc):
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="module")
def engine_process():
    """``dressage engine serve`` as its own process (the documented multi-process path); its URL."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(["engine", "serve", "--port", str(port), "--tool-call-rate", "0.5",
                   "--mean-response-tokens", "24"], url)
    yield url
    _stop(proc)


def _rollout_then_train(engine_url, tmp_path, *, tq: bool, spec_file=None, on_start=None):
    """Proxy process (TQ off; on with a TQ it starts; or joined to ``spec_file``'s), agents, trainer
    process: the trainer's report and what the Proxy still holds. ``on_start(pid)`` runs once it serves."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["proxy", "serve", "--engine-url", engine_url, "--port", str(port),
            "--use-rollout-routing-replay", "--routed-experts-dtype", "uint8"]
    if spec_file is not None:
        args += ["--enable-transfer-queue", "--transfer-queue-spec", str(spec_file)]
    elif tq:
        cfg = tmp_path / "tq.yaml"
        cfg.write_text("deployment: local\nnum_storage_units: 2\n")
        args += ["--enable-transfer-queue", "--transfer-queue-config", str(cfg)]
    proxy = _start(args, url)
    try:
        if on_start is not None:
            on_start(proxy.pid)
        report = asyncio.run(run_rollout(url, make_prompts(N_PROMPTS, seed=5), N_SAMPLES,
                                         AgentConfig(seed=11, max_turns=3), concurrency=3))
        assert report.errors == 0, report.errors_by_kind
        out = tmp_path / "reports" / f"trainer_{'tq' if tq else 'plain'}.json"  # its folder made by the trainer
        trainer = subprocess.run(
            [sys.executable, "-m", "dressage", "trainer", "--proxy-url", url, "--dp-size", "2",
             "--expect-sessions", str(N_PROMPTS * N_SAMPLES), "--timeout", "30", "--json", str(out)],
            capture_output=True, text=True, timeout=120)
        assert trainer.returncode == 0, trainer.stdout + trainer.stderr
        stats = httpx.post(f"{url}/trajectory/read", json={"drain": False}, timeout=10).json()
        return json.loads(out.read_text()), stats
    finally:
        _stop(proxy)


def test_trainer_process_restores_refs_from_the_proxys_transfer_queue(engine_process, tmp_path):
    with_tq, left = _rollout_then_train(engine_process, tmp_path, tq=True)
    assert with_tq["transfer_queue"] is True
    assert with_tq["sessions"] == N_PROMPTS * N_SAMPLES and with_tq["samples"] >= with_tq["sessions"]
    assert with_tq["tq_keys_read"] > 0 and with_tq["tq_keys_released"] == with_tq["tq_keys_read"]
    assert with_tq["tq_keys_left"] == 0
    assert with_tq["large_field_bytes_restored"] > 0
    assert left["trajectories"] == []  # drained: the Proxy no longer holds them

    without_tq, _ = _rollout_then_train(engine_process, tmp_path, tq=False)
    assert without_tq["transfer_queue"] is False and without_tq["tq_keys_read"] == 0
    # Same agents, same engine seed: the trainer sees bit-identical Samples whichever path they took.
    assert with_tq["samples_digest"] == without_tq["samples_digest"]
    assert with_tq["large_field_bytes_restored"] == without_tq["large_field_bytes_restored"]


def test_a_proxy_process_joins_a_running_transfer_queue_by_its_spec_and_loads_no_ray(engine_process, tmp_path):
    """The seed's deployment: the TQ is started elsewhere (here by the test; on a cluster by the driver,
    on Ray), the Proxy joins it from a spec file, so it needs no Ray, and the trainer joins it from the
    spec the Proxy passes on. The TQ outlives the Proxy, and its keys are gone once the trainer is done."""
    from dressage.tq import TransferQueue

    tq = TransferQueue.start({"deployment": "local", "num_storage_units": 1, "retention_s": None})
    try:
        spec_file = tmp_path / "tq.json"
        tq.write_client_spec(spec_file)
        assert stat.S_IMODE(spec_file.stat().st_mode) == 0o600  # it carries the TQ's secret

        def outside_ray(pid):
            with open(f"/proc/{pid}/maps") as f:
                assert "_raylet" not in f.read()

        joined, left = _rollout_then_train(engine_process, tmp_path, tq=True, spec_file=spec_file, on_start=outside_ray)
        assert joined["transfer_queue"] is True and joined["sessions"] == N_PROMPTS * N_SAMPLES
        assert joined["tq_keys_read"] > 0 and joined["tq_keys_released"] == joined["tq_keys_read"]
        assert left["trajectories"] == [] and tq.client().total_keys() == 0  # the TQ runs on, emptied
        without_tq, _ = _rollout_then_train(engine_process, tmp_path, tq=False)
        assert joined["samples_digest"] == without_tq["samples_digest"]
    finally:
        tq.shutdown()


def test_a_spec_that_is_not_one_stops_the_proxy_with_its_name(engine_process, tmp_path):
    bad = tmp_path / "tq.json"
    bad.write_text('{"spec_version": 99}')
    proc = subprocess.run([sys.executable, "-m", "dressage", "proxy", "serve", "--engine-url", engine_process,
                           "--port", str(_free_port()), "--enable-transfer-queue", "--transfer-queue-spec", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "tq.json" in proc.stderr and "spec" in proc.stderr


def test_a_proxy_process_writes_its_spec_file_while_it_serves(engine_process, tmp_path):
    """``--transfer-queue-spec-out``: the spec of the TQ the Proxy started, in a file for processes that
    join by file, the same one ``GET /transfer_queue/spec`` answers; gone once the Proxy stopped."""
    from dressage.tq.client.spec import load_client_spec

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    spec_file = tmp_path / "out" / "tq.json"
    spec_file.parent.mkdir()
    proxy = _start(["proxy", "serve", "--engine-url", engine_process, "--port", str(port), "--enable-transfer-queue",
                    "--transfer-queue-spec-out", str(spec_file)], url)
    try:
        assert stat.S_IMODE(spec_file.stat().st_mode) == 0o600
        assert load_client_spec(spec_file) == httpx.get(f"{url}/transfer_queue/spec", timeout=10).json()
    finally:
        _stop(proxy)
    assert proxy.returncode == 0 and not spec_file.exists()


def test_the_standalone_recipe_with_tq_serve_loses_nothing_across_a_proxy_restart(engine_process, tmp_path):
    """README's recipe: ``dressage tq serve`` runs the TQ apart; a Proxy with a journal joins it, the agents
    finish, the Proxy is restarted, and the trainer (of the restarted Proxy) restores every large field."""
    config = tmp_path / "tq.yaml"
    config.write_text("deployment: local\nnum_storage_units: 2\nretention_s: null\n")
    spec_file = tmp_path / "run" / "tq-spec.json"
    tq = subprocess.Popen([sys.executable, "-m", "dressage", "tq", "serve", "--config", str(config),
                           "--spec-out", str(spec_file)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not spec_file.exists():
            assert tq.poll() is None and time.monotonic() < deadline, tq.stdout.read() if tq.poll() else "no spec"
            time.sleep(0.05)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        args = ["proxy", "serve", "--engine-url", engine_process, "--port", str(port), "--use-rollout-routing-replay",
                "--routed-experts-dtype", "uint8", "--enable-transfer-queue", "--transfer-queue-spec", str(spec_file),
                "--journal", str(tmp_path / "journal.bin")]
        proxy = _start(args, url)
        try:
            report = asyncio.run(run_rollout(url, make_prompts(N_PROMPTS, seed=5), N_SAMPLES,
                                             AgentConfig(seed=11, max_turns=3), concurrency=3))
            assert report.errors == 0, report.errors_by_kind
        finally:
            _stop(proxy)
        proxy = _start(args, url)  # the restarted Proxy: sessions from its journal, fields still in the TQ
        try:
            out = tmp_path / "trainer.json"
            trainer = subprocess.run(
                [sys.executable, "-m", "dressage", "trainer", "--proxy-url", url, "--dp-size", "2",
                 "--expect-sessions", str(N_PROMPTS * N_SAMPLES), "--timeout", "30", "--json", str(out)],
                capture_output=True, text=True, timeout=120)
            assert trainer.returncode == 0, trainer.stdout + trainer.stderr
            result = json.loads(out.read_text())
        finally:
            _stop(proxy)
        assert result["transfer_queue"] is True and result["sessions"] == N_PROMPTS * N_SAMPLES
        assert result["tq_keys_read"] > 0 and result["tq_keys_released"] == result["tq_keys_read"]
        assert result["large_field_bytes_restored"] > 0 and result["tq_keys_left"] == 0
    finally:
        tq.terminate()
        assert tq.wait(60) == 0
        tq.stdout.close()
    assert not spec_file.exists()
