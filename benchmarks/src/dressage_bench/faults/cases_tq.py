"""TransferQueue fault cases of ``dressage bench faults``: dead and stopped units, corrupted blobs,
and wire fuzzing, each against real StorageUnit processes (backpressure: cases_backpressure).

Every case starts its own deployment and shuts it down (processes, Ray, /dev/shm segments) before it
returns, on success and on failure.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import numpy as np

from dressage_bench.faults.runner import FaultsConfig, case
from dressage.errors import IntegrityError, StorageUnitUnavailable
from dressage.testing import corrupt_blob, kill_unit, stopped_unit
from dressage.train import TrainingReader
from dressage.trajectory import Piece, Sample
from dressage.tq import TransferQueue

__all__: list[str] = []

_T, _R, _L, _K = 64, 16, 4, 8     # a small Sample: 64 tokens, R3 [63, 4, 8] uint8
_HEARTBEAT_S, _DEAD_AFTER_S = 0.2, 1.0


def _local(units: int = 2, **extra: Any) -> dict[str, Any]:
    return {"deployment": "local", "num_storage_units": units, "unit_memory_budget": "8MiB",
            "request_timeout_s": 20, "heartbeat_interval_s": _HEARTBEAT_S, "unit_dead_after_s": _DEAD_AFTER_S,
            "retention_s": None, **extra}


def _sample(client: Any, i: int, batch: str = "rollout-0") -> Sample:
    """One Sample whose logprobs and R3 live in TQ (the shape the Proxy leaves them in)."""
    lp = np.full(_R, i, dtype=np.float32)
    r3 = np.full((_T - 1, _L, _K), i % 250, dtype=np.uint8)
    lp_ref, r3_ref = client.put_many([("logprobs", lp), ("routed_experts", r3)], batch=batch)
    s = Sample(tokens=np.arange(_T, dtype=np.int32), response_length=_R, loss_mask=np.ones(_R, dtype=np.int32),
               token_versions=np.zeros(_R, dtype=np.int32), session_id=f"sess{i}", group_index=i,
               r3_trailing=(_L, _K))
    s.remote = {"logprobs": (Piece(lp_ref, 0, _R),), "routed_experts": (Piece(r3_ref, 0, _T - 1),)}
    return s


def _unit_of(s: Sample) -> str:
    return s.remote["logprobs"][0].value.unit_id


def _refs(samples: list[Sample]) -> list[Any]:
    return [p.value for s in samples for pieces in s.remote.values() for p in pieces]


def _wait_state(tq: TransferQueue, unit_id: str, state: str, timeout_s: float) -> float | None:
    t0 = time.monotonic()
    while tq.unit_states()[unit_id]["state"] != state:
        if time.monotonic() - t0 > timeout_s:
            return None
        time.sleep(0.01)
    return round(time.monotonic() - t0, 3)


def _fail_fast_read(client: Any, refs: list[Any]) -> dict[str, Any]:
    keys = [r.key for r in refs]
    t0 = time.monotonic()
    try:
        client.get_many(refs)
    except StorageUnitUnavailable as exc:
        msg = str(exc)
        return {"raised": "StorageUnitUnavailable", "seconds": round(time.monotonic() - t0, 3),
                "names_unit": refs[0].unit_id in msg, "names_keys": all(k in msg for k in keys[:8]),
                "message": msg[:300]}
    return {"raised": None, "seconds": round(time.monotonic() - t0, 3)}


def _gone(pids: dict[str, int]) -> bool:
    import psutil

    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids.values())


def _killed_case(tq: TransferQueue, cfg: FaultsConfig,
                 writers: list[Any] | None = None) -> tuple[bool, dict[str, Any]]:
    """Shared by the local and Ray kill cases: kill a unit mid-rollout, then check everything.
    ``writers``: clients that write the Samples in turn (one per node, so every unit holds some)."""
    client = tq.client()
    writers = writers or [client]
    n = 8 if cfg.quick else 32
    samples = [_sample(writers[i % len(writers)], i) for i in range(n)]
    victim = _unit_of(samples[0])
    hit = [s for s in samples if _unit_of(s) == victim]
    kill_unit(tq, victim)
    marked = _wait_state(tq, victim, "dead", 30.0)
    later = [_sample(client, 1000 + i) for i in range(n // 2)]
    read = _fail_fast_read(client, [s.remote["logprobs"][0].value for s in hit])
    reader = TrainingReader(client, on_lost="drop")
    kept = reader.restore(samples)
    dropped = sorted(s.session_id for s in (reader.last_lost.samples if reader.last_lost else []))
    intact = all(s.rollout_log_probs is not None and float(s.rollout_log_probs[0]) == float(s.session_id[4:])
                 for s in kept)
    detail = {
        "units": len(tq.units()), "samples_written": n, "samples_on_victim": len(hit), "victim": victim,
        "seconds_to_marked_dead": marked,
        "new_puts": len(later), "new_puts_on_victim": sum(_unit_of(s) == victim for s in later),
        "lost_read": read, "reader_dropped": dropped,
        "reader_dropped_exactly_affected": dropped == sorted(s.session_id for s in hit),
        "kept_samples_intact": intact, "state": tq.unit_states()[victim],
    }
    passed = (marked is not None and detail["new_puts_on_victim"] == 0 and read["raised"] is not None
              and read["names_unit"] and read["names_keys"] and read["seconds"] < 1.0
              and detail["reader_dropped_exactly_affected"] and intact and len(kept) == n - len(hit))
    return passed, detail


@case("storage_unit_killed")
def storage_unit_killed(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    tq = TransferQueue.start(_local())
    pids = tq.processes()
    tokens = [u.get("shm_token") for u in tq.client_spec()["units"]]
    try:
        passed, detail = _killed_case(tq, cfg)
    finally:
        tq.shutdown()
    detail["processes_left"] = not _gone(pids)
    detail["shm_segments_left"] = sum(len([f for f in os.listdir("/dev/shm") if f.startswith(f"dtq-{t}-")])
                                      for t in tokens if t) if os.path.isdir("/dev/shm") else 0
    return passed and not detail["processes_left"] and detail["shm_segments_left"] == 0, detail


@case("storage_unit_stopped")
def storage_unit_stopped(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    tq = TransferQueue.start(_local())
    pids = tq.processes()
    try:
        client = tq.client()
        samples = [_sample(client, i) for i in range(8 if cfg.quick else 32)]
        victim = _unit_of(samples[0])
        hit = [s for s in samples if _unit_of(s) == victim]
        with stopped_unit(tq, victim):
            marked = _wait_state(tq, victim, "dead", 30.0)
            read = _fail_fast_read(client, [s.remote["logprobs"][0].value for s in hit])
            t0 = time.monotonic()
            during = [_sample(client, 500 + i) for i in range(4)]
            put_s = round(time.monotonic() - t0, 3)
        back = _wait_state(tq, victim, "live", 30.0)
        deadline = time.monotonic() + 2.0  # the client's copy of unit states is at most 0.2 s old
        while victim in client.dead_units() and time.monotonic() < deadline:
            time.sleep(0.02)
        restored = TrainingReader(client, on_lost="fail").restore(hit)
        intact = all(float(s.rollout_log_probs[0]) == float(s.session_id[4:]) for s in restored)
        after = [_sample(client, 900 + i) for i in range(8)]
        cleared = client.clear("rollout-0")
        detail = {
            "victim": victim, "samples_on_victim": len(hit), "unit_dead_after_s": _DEAD_AFTER_S,
            "heartbeat_interval_s": _HEARTBEAT_S, "seconds_to_marked_dead": marked, "lost_read": read,
            "puts_while_stopped": len(during), "puts_while_stopped_on_victim": sum(_unit_of(s) == victim for s in during),
            "seconds_for_puts_while_stopped": put_s, "seconds_to_live_after_sigcont": back,
            "victim_samples_intact_after_resume": intact and len(restored) == len(hit),
            "puts_after_resume_on_victim": sum(_unit_of(s) == victim for s in after),
            "keys_cleared": cleared, "keys_left": tq.total_keys(),
        }
    finally:
        tq.shutdown()
    detail["processes_left"] = not _gone(pids)
    passed = (marked is not None and read["raised"] is not None and read["names_unit"] and read["names_keys"]
              and read["seconds"] < 1.0 and detail["puts_while_stopped_on_victim"] == 0 and back is not None
              and detail["victim_samples_intact_after_resume"] and detail["keys_left"] == 0
              and not detail["processes_left"])
    return passed, detail


@case("corrupted_blob")
def corrupted_blob(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    rng = np.random.default_rng(cfg.seed)
    blob = rng.integers(0, 255, size=(4096, 8, 32), dtype=np.uint8)   # 1 MiB, rows of 256 B
    detail: dict[str, Any] = {}

    def attempt(client: Any, ref: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            client.get(ref)
            out["bad_rows"] = "returned data"
        except IntegrityError as exc:
            out["bad_rows"] = "IntegrityError"
            out["message"] = str(exc)[:200]
        good = client.get(ref.narrow(0, 1024))
        out["good_block_reads"] = bool(np.array_equal(good, blob[:1024]))
        return out

    # In memory (an embedded unit): flip one byte of the stored bytes. In-process reads of the unit's own
    # memory are verified only with verify_local_reads (off by default; see docs/transferqueue.md).
    with TransferQueue.start({"retention_s": None, "unit_memory_budget": "16MiB", "verify_local_reads": True}) as tq:
        client = tq.client()
        ref = client.put("routed_experts", blob)
        corrupt_blob(tq.storage_units()[ref.unit_id], ref.key, 3000 * 256 + 5)
        detail["memory"] = attempt(client, ref)
    # On disk, across processes: a unit process spills the blob; flip one byte of its file.
    with tempfile.TemporaryDirectory(prefix="dressage-faults-") as spill:
        tq = TransferQueue.start(_local(1, unit_memory_budget="256KiB", spill_dir=spill, shared_memory=False))
        try:
            client = tq.client()
            ref = client.put("routed_experts", blob)
            files = [os.path.join(root, f) for root, _, names in os.walk(spill) for f in names if f.endswith(".blob")]
            with open(files[0], "r+b") as f:
                f.seek(3000 * 256 + 5)
                byte = f.read(1)
                f.seek(3000 * 256 + 5)
                f.write(bytes([byte[0] ^ 0x40]))
            detail["spill_file"] = {**attempt(client, ref), "spilled_bytes": tq.stats()["unit0"]["spilled_bytes"]}
        finally:
            tq.shutdown()
    passed = all(detail[k]["bad_rows"] == "IntegrityError" and detail[k]["good_block_reads"]
                 for k in ("memory", "spill_file"))
    return passed, detail


@case("wire_fuzz")
def wire_fuzz(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    from dressage.tq.directory.service import RemoteController
    from dressage.tq.storage.remote import RemoteStorageUnit
    from dressage.tq.storage.config import UNIT_ZMQ_MAX_MESSAGE
    from dressage.tq.storage.server import HEARTBEAT_MAX_MESSAGE
    from dressage.tq.transport.zmq import CONTROL_MAX_MESSAGE
    from dressage.testing.wirefuzz import fuzz_server

    secret = "faults-wire-fuzz-secret"
    reports: dict[str, Any] = {}
    for label, extra in (("open", {"authenticate": False}), ("hmac", {"auth_secret": secret})):
        tq = TransferQueue.start(_local(1, **extra))
        try:
            spec = tq.client_spec()
            key = secret.encode() if "auth_secret" in extra else None
            unit = RemoteStorageUnit("unit0", spec["units"][0]["address"], timeout_s=10, secret=key)
            unit.put("good", np.arange(64, dtype=np.int32))

            def check() -> None:
                if unit.get("good", 5, 7).tolist() != [5, 6]:
                    raise AssertionError("the unit returned wrong data after fuzzing")

            # Each socket's ZMQ_MAXMSGSIZE: a message with a larger frame is dropped by libzmq with the
            # connection (it never reaches the handler, so there is nothing to answer); the fuzzer then
            # requires that drop. Any other unanswered message still counts as a hang.
            rep = fuzz_server(unit.address, cfg.fuzz_inputs, seed=cfg.seed, secret=key, check_valid=check,
                              untyped_counter=lambda: int(unit.stats()["untyped_errors"]),
                              max_frame_bytes=UNIT_ZMQ_MAX_MESSAGE)
            ctl = RemoteController(spec["controller"], timeout_s=10, secret=key)
            crep = fuzz_server(spec["controller"], cfg.fuzz_inputs // 2, seed=cfg.seed + 1, secret=key,
                               check_valid=ctl.ping, max_frame_bytes=CONTROL_MAX_MESSAGE)
            beat = RemoteStorageUnit("unit0", spec["units"][0]["heartbeat"], timeout_s=10, secret=key)
            hrep = fuzz_server(beat.address, cfg.fuzz_inputs // 4, seed=cfg.seed + 2, secret=key,
                               check_valid=beat.ping, max_frame_bytes=HEARTBEAT_MAX_MESSAGE)
            beat.close()
            reports[label] = {"unit": rep.as_dict(), "controller": crep.as_dict(), "heartbeat": hrep.as_dict(),
                              "rejected_frames": unit.stats()["rejected_frames"], "unit_alive": True}
            unit.close()
            ctl.close()
        finally:
            tq.shutdown()
    inputs = sum(r[s]["wire_inputs"] for r in reports.values() for s in ("unit", "controller", "heartbeat"))
    untyped = sum(r[s]["wire_untyped_errors"] for r in reports.values() for s in ("unit", "controller", "heartbeat"))
    hangs = sum(r[s]["wire_no_reply"] for r in reports.values() for s in ("unit", "controller", "heartbeat"))
    dropped = sum(r[s]["wire_dropped"] for r in reports.values() for s in ("unit", "controller", "heartbeat"))
    valid_after = all(r[s]["valid_after"] for r in reports.values() for s in ("unit", "controller", "heartbeat"))
    detail = {"fuzz": {"wire_inputs": inputs, "wire_untyped_errors": untyped, "wire_no_reply": hangs,
                       "wire_dropped_over_limit": dropped},
              "valid_requests_served_after": valid_after, "reports": reports}
    return untyped == 0 and hangs == 0 and valid_after, detail


@case("storage_unit_killed_ray")
def storage_unit_killed_ray(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        return False, {"error": "ray is not installed (pip install 'dressage[ray]')"}
    if ray.is_initialized():
        return False, {"error": "Ray is already initialised in this process; the case needs its own cluster"}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    tq = None
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, logging_level="ERROR")
        # Two units (on the worker node: the head keeps none): the survivor takes the puts after the kill.
        # With one unit per worker node and one worker, the kill would leave no live unit to place on.
        tq = TransferQueue.start({"deployment": "ray", "num_storage_units": 2, "unit_memory_budget": "8MiB",
                                  "request_timeout_s": 20,
                                  "heartbeat_interval_s": _HEARTBEAT_S, "unit_dead_after_s": _DEAD_AFTER_S,
                                  "retention_s": None, "startup_timeout_s": 120})
        # One rollout worker per unit, on the unit's node.
        unit_nodes = {u.unit_id: u.node_id for u in tq.units()}
        writers = [tq.client(node_id=node) for node in unit_nodes.values()]
        passed, detail = _killed_case(tq, cfg, writers)
        detail["nodes"] = len([n for n in ray.nodes() if n.get("Alive")])
        detail["unit_nodes"] = {u: (n or "")[:12] for u, n in unit_nodes.items()}
    finally:
        if tq is not None:
            tq.shutdown()
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    return passed, detail
