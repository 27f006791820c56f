"""TransferQueue cases of ``dressage bench faults`` about the TQ as a service: the Controller process
killed and started again mid-run, and peers without the secret that declare huge payloads.

Each case starts its own deployment and shuts it down before it returns, on success and on failure.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

import numpy as np

from dressage_bench.faults.cases_tq import _gone, _local, _refs, _sample
from dressage_bench.faults.runner import FaultsConfig, case
from dressage.errors import TransferQueueError
from dressage.train import TrainingReader
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
