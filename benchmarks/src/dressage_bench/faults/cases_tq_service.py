"""TransferQueue cases of ``dressage bench faults`` about the TQ as a service: the Controller process
killed and started again mid-run, peers without the secret that declare huge payloads, and a Proxy
SIGKILLed and restarted from its journal while ``dressage tq serve`` keeps the large fields.

Each case starts its own deployment and shuts it down before it returns, on success and on failure.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from dressage_bench.faults.cases_tq import _gone, _local, _refs, _sample
from dressage_bench.faults.runner import FaultsConfig, case
from dressage.errors import TransferQueueError
from dressage.train import TrainingReader
from dressage.trajectory import Piece
from dressage.tq import TransferQueue

__all__: list[str] = []

MiB = 1 << 20


def _wait(check: Any, timeout_s: float) -> float | None:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout_s:
            return None
        time.sleep(0.01)
    return round(time.monotonic() - t0, 3)


@case("controller_killed")
def controller_killed(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    """A writer puts Samples without pause; the Controller process is SIGKILLed mid-run. Every put that
    returned (acknowledged) must be readable afterwards, and writes go on once it is back."""
    tq = TransferQueue.start(_local(2))
    pids = tq.processes()
    client = tq.client()
    acked: list[Any] = []
    refused: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            try:
                acked.append(_sample(client, i))
            except TransferQueueError as exc:  # not acknowledged: the writer would retry it
                refused.append(f"{type(exc).__name__}: {str(exc)[:160]}")
                time.sleep(0.05)
            i += 1

    n = 8 if cfg.quick else 32
    thread = threading.Thread(target=writer, name="faults-writer", daemon=True)
    try:
        thread.start()
        before = _wait(lambda: len(acked) >= n, 60.0)
        old_pid = tq.processes()["controller"]
        at_kill = len(acked)
        os.kill(old_pid, signal.SIGKILL)
        restarted = _wait(lambda: tq._deployment.controller_restarts >= 1, 60.0)
        after = _wait(lambda: len(acked) >= at_kill + n, 60.0)
        stop.set()
        thread.join(30)
        refs = _refs(acked)  # before the restore, which replaces the refs with the fields
        restored = TrainingReader(client, on_lost="fail").restore(list(acked))
        intact = all(float(s.rollout_log_probs[0]) == float(s.session_id[4:])
                     and int(s.rollout_routed_experts[0, 0, 0]) == int(s.session_id[4:]) % 250 for s in restored)
        deleted = client.delete(refs)
        detail = {"acknowledged_puts": len(acked), "acknowledged_before_kill": at_kill,
                  "puts_refused_during_restart": len(refused), "refusals": refused[:4],
                  "seconds_to_first_puts": before, "seconds_to_restart": restarted,
                  "seconds_to_resume_writing": after, "controller_pid_changed": tq.processes()["controller"] != old_pid,
                  "restored_samples": len(restored), "acknowledged_lost": len(acked) - len(restored),
                  "restored_intact": intact, "keys_deleted": deleted,
                  # Keys of puts refused mid-restart (placed, never acknowledged) expire by retention.
                  "keys_left": tq.total_keys(), "keys_of_refused_puts": 2 * len(refused)}
    finally:
        stop.set()
        tq.shutdown()
    detail["processes_left"] = not _gone(pids)
    passed = (restarted is not None and after is not None and detail["acknowledged_lost"] == 0 and intact
              and detail["controller_pid_changed"] and deleted == len(refs)
              and detail["keys_left"] <= detail["keys_of_refused_puts"] and not detail["processes_left"])
    return passed, detail


def _unit_memory(pid: int, token: str | None) -> int:
    """What a unit process holds: its resident pages (shared ones included) plus its /dev/shm segments."""
    import psutil

    rss = psutil.Process(pid).memory_info().rss
    shm = 0
    if token and os.path.isdir("/dev/shm"):
        for name in os.listdir("/dev/shm"):
            if name.startswith(f"dtq-{token}-"):
                try:
                    shm += os.stat(os.path.join("/dev/shm", name)).st_blocks * 512
                except OSError:
                    pass
    return rss + shm


@case("unauthenticated_large_sizes")
def unauthenticated_large_sizes(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    """Peers without the secret declare 512 MiB and 16 GiB payloads on a unit's bulk port, send a few
    bytes and hold their connections; another sends a 64 MiB frame to its ZMQ socket. The unit's memory
    must move by less than its ZMQ cap, not by what was declared, and it keeps serving."""
    import zmq

    from dressage.tq.storage.config import UNIT_ZMQ_MAX_MESSAGE
    from dressage.tq.storage.remote import RemoteStorageUnit
    from dressage.tq.transport import bulk, wire

    tq = TransferQueue.start(_local(1, unit_memory_budget="64MiB"))
    pids = tq.processes()
    held: list[socket.socket] = []
    detail: dict[str, Any] = {}
    try:
        spec = tq.client_spec()
        unit_spec = spec["units"][0]
        secret = spec["auth_secret"].encode()
        handle = RemoteStorageUnit.describe("unit0", unit_spec["address"], timeout_s=10, secret=secret)
        described, _ = handle._rpc.call("describe")
        pid, token = int(described["pid"]), unit_spec.get("shm_token")
        host, port = unit_spec["address"][len("tcp://"):].rsplit(":", 1)[0], int(described["bulk_port"])
        base = _unit_memory(pid, token)
        declared = [512 * MiB] * (2 if cfg.quick else 8) + [16 << 30]
        for size in declared:
            sock = socket.create_connection((host, port), timeout=5)
            prefix = bulk._PREFIX.pack(bulk.MAGIC, 10, 1)
            sock.sendall(prefix + wire.auth_head(os.urandom(16), 1) + size.to_bytes(8, "little") + bytes(16)
                         + bytes(4096))
            held.append(sock)
        # A ZMQ frame over the unit's cap, without the secret: libzmq drops it while reading its header.
        ctx = zmq.Context.instance()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(unit_spec["address"])
        dealer.send_multipart([b"\x01\x80", bytes(64 * MiB)])
        time.sleep(1.0)  # let the unit read what it was sent (a wait for the hostile peers, not a measure)
        dealer.close(0)
        peak = _unit_memory(pid, token)
        refused = handle.stats()["rejected_frames"]
        good = np.arange(1 << 16, dtype=np.float32)
        handle.put("after", good)
        served = bool(np.array_equal(handle.get("after"), good))
        handle.close()
        detail = {"declared_bytes": sum(declared), "declarations": len(declared),
                  "zmq_frame_bytes": 64 * MiB, "unit_memory_before": base, "unit_memory_after": peak,
                  "unit_memory_growth": peak - base, "cap_bytes": UNIT_ZMQ_MAX_MESSAGE,
                  "bulk_heads_refused": refused, "valid_put_get_after": served,
                  "unit_state": tq.unit_states()["unit0"]["state"]}
    finally:
        for sock in held:
            sock.close()
        tq.shutdown()
    detail["processes_left"] = not _gone(pids)
    passed = (detail["unit_memory_growth"] < detail["cap_bytes"] and detail["bulk_heads_refused"] >= len(declared)
              and detail["valid_put_get_after"] and detail["unit_state"] == "live" and not detail["processes_left"])
    return passed, detail


def _serve_tq(config: Path, spec_out: Path) -> subprocess.Popen:
    """``dressage tq serve`` as its own process; returns once its client spec file exists."""
    proc = subprocess.Popen([sys.executable, "-m", "dressage", "tq", "serve", "--config", str(config),
                             "--spec-out", str(spec_out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    if _wait(lambda: spec_out.exists() or proc.poll() is not None, 60.0) is None or proc.poll() is not None:
        _stop_tq(proc)
        raise RuntimeError(f"dressage tq serve did not write {spec_out} (exit code {proc.returncode})")
    return proc


def _stop_tq(proc: subprocess.Popen) -> int | None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _large_fields(samples: list[Any]) -> dict[tuple[str, int], tuple[bytes, bytes]]:
    """Each Sample's restored logprobs and routed experts, as raw bytes (a bit-exact comparison)."""
    return {(s.session_id, s.segment_index): (np.ascontiguousarray(s.rollout_log_probs).tobytes(),
                                              np.ascontiguousarray(s.rollout_routed_experts).tobytes())
            for s in samples}


def _tq_keys(samples: list[Any]) -> set[str]:
    """The TQ keys a leased batch's Samples point at (their prompt parts of later turns are fills, no key)."""
    return {p.value.key for s in samples for pieces in s.remote.values() for p in pieces
            if isinstance(p, Piece) and not isinstance(p.value, np.ndarray)}


def _agent_turn(url: str, sid: str, messages: list[dict[str, Any]], i: int) -> tuple[list[dict[str, Any]], list[float]]:
    """One model call of session ``sid``: the conversation to go on with, and the logprobs the agent was answered."""
    r = httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 12, "logprobs": True},
                   headers={"X-Session-Id": sid, "X-Instance-Id": f"agent{i}"}, timeout=30)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return ([*messages, choice["message"], {"role": "user", "content": "Go on."}],
            [float(t["logprob"]) for t in choice["logprobs"]["content"]])


def _answered_match(restored: list[Any], answered: dict[str, list[float]]) -> bool:
    """Each session's trainable logprobs (its Samples in order, loss-masked) are the ones its agent was answered."""
    by_session: dict[str, list[Any]] = {}
    for s in sorted(restored, key=lambda s: s.segment_index):
        by_session.setdefault(s.session_id, []).append(s)
    return set(by_session) == set(answered) and all(
        len(answered[sid]) > 0 and np.array_equal(
            np.concatenate([s.rollout_log_probs[s.loss_mask.astype(bool)] for s in samples]),
            np.asarray(answered[sid], dtype=np.float32)) for sid, samples in by_session.items())


@case("proxy_restart_tq_served_apart")
def proxy_restart_tq_served_apart(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    """The standalone recipe: ``dressage tq serve`` runs the TQ apart, a journaled Proxy with R3 joins it
    by its spec; agents finalize some sessions (acknowledged) and leave others active; the Proxy is
    SIGKILLed and started again from its journal against the same TQ. A leased reader then restores
    every acknowledged trajectory's large fields bit-identical to what was recorded before the kill,
    acknowledges the read and releases the keys: nothing acknowledged is lost, no key is left."""
    from dressage.train.remote import ProxyTrajectorySource
    from dressage.tq import TransferQueueClient
    from dressage_bench.faults._stack import serve_process, start_engine

    finalized_n, active_n = (4, 2) if cfg.quick else (16, 6)
    engine = start_engine()
    with tempfile.TemporaryDirectory() as tmp:
        config, spec_out = Path(tmp) / "tq.yaml", Path(tmp) / "run" / "tq-spec.json"
        config.write_text("deployment: local\nnum_storage_units: 2\nretention_s: null\n")
        tq = _serve_tq(config, spec_out)
        client = TransferQueueClient.connect(json.loads(spec_out.read_text()))
        args = ["proxy", "serve", "--engine-url", engine.url, "--use-rollout-routing-replay",
                "--routed-experts-dtype", "uint8", "--enable-transfer-queue", "--transfer-queue-spec",
                str(spec_out), "--journal", str(Path(tmp) / "proxy.journal")]
        proxy = restarted = None
        try:
            proxy = serve_process(args)
            finalized = [f"done-{i}" for i in range(finalized_n)]
            active = [f"open-{i}" for i in range(active_n)]
            convs: dict[str, list[dict[str, Any]]] = {}
            answered: dict[str, list[float]] = {}
            for i, sid in enumerate(finalized + active):
                convs[sid], answered[sid] = _agent_turn(
                    proxy.url, sid, [{"role": "user", "content": f"Job {i}: spell 'river'."}], i)
            for sid in finalized:
                httpx.post(proxy.url + "/session/finalize", json={"session_id": sid, "reward": 1.0},
                           timeout=30).raise_for_status()  # a 200: acknowledged
            # What the Proxy recorded before the kill: a look (no lease, no drain) restored from the TQ.
            look = ProxyTrajectorySource(proxy.url, timeout_s=30)
            before = _large_fields(TrainingReader(client, on_lost="fail").restore(look.read().samples))
            keys_before_kill = client.total_keys()
            proxy.proc.kill()                                   # SIGKILL: no shutdown path runs
            proxy.proc.wait()
            restarted = serve_process(args, port=int(proxy.url.rsplit(":", 1)[1]))
            states = {sid: httpx.get(f"{restarted.url}/sessions/{sid}", timeout=30).json()["state"]
                      for sid in finalized + active}
            for i, sid in enumerate(active):  # the agents left active go on with the restarted Proxy, then finish
                convs[sid], more = _agent_turn(restarted.url, sid, convs[sid], finalized_n + i)
                answered[sid] += more
                httpx.post(restarted.url + "/session/finalize", json={"session_id": sid, "reward": 0.5},
                           timeout=30).raise_for_status()
            source = ProxyTrajectorySource(restarted.url, timeout_s=30)
            batch = source.read(lease=True)
            reader = TrainingReader(source.client(), on_lost="drop")
            keys = _tq_keys(batch.samples)                      # before the restore replaces them with arrays
            restored = reader.restore(batch.samples)
            lost_samples = len(reader.last_lost.samples) if reader.last_lost else 0
            acked = source.ack(batch) if not lost_samples else 0
            if lost_samples:
                source.release(batch)
            after = _large_fields(restored)
            read_sessions = {s.session_id for s in batch.samples}
            restored_sessions = {s.session_id for s in restored}
            released = client.delete(keys)
            source.close()
            detail = {"sessions_finalized_before_kill": finalized_n, "sessions_active_at_kill": active_n,
                      "states_after_restart": sorted(set(states.values())),
                      "finalized_kept": all(states[s] == "finalized" for s in finalized),
                      "active_kept": all(states[s] == "active" for s in active),
                      "tq_keys_before_kill": keys_before_kill, "trajectories_read": batch.trajectories,
                      "acknowledged_lost": sum(1 for s in finalized if s not in restored_sessions),
                      "large_fields_lost": lost_samples,
                      "bit_identical_to_before_kill": all(after.get(k) == v for k, v in before.items()),
                      "samples_compared": len(before),
                      "logprobs_match_answers": _answered_match(restored, answered),
                      "reads_acknowledged": acked, "tq_keys_read": len(keys),
                      "tq_keys_released": released, "keys_left": client.total_keys(),
                      "unread_sessions": sorted(set(finalized + active) - read_sessions)}
        finally:
            for served in (restarted, proxy):
                if served is not None:
                    served.stop()
            client.close()
            detail_rc = _stop_tq(tq)
            engine.stop()
    detail["tq_serve_exit_code"] = detail_rc
    detail["spec_removed"] = not spec_out.exists()
    passed = (detail["acknowledged_lost"] == 0 and detail["large_fields_lost"] == 0 and detail["finalized_kept"]
              and detail["active_kept"] and detail["bit_identical_to_before_kill"]
              and detail["samples_compared"] >= finalized_n and detail["logprobs_match_answers"]
              and detail["reads_acknowledged"] == finalized_n + active_n and not detail["unread_sessions"]
              and detail["tq_keys_released"] == detail["tq_keys_read"] > 0 and detail["keys_left"] == 0
              and detail_rc == 0)
    return passed, detail
