"""Durability faults: no acknowledged trajectory is lost to a poisoned drain, a full disk or a damaged journal.

An acknowledged trajectory is one whose finalize answered 200. Each case counts those that are
neither still held by the Proxy nor handed to a reader that acknowledged them: ``acknowledged_lost``.
"""

from __future__ import annotations

import contextlib
import errno
import tempfile
from pathlib import Path
from typing import Any, Iterator

import httpx
import msgpack

from dressage.errors import JournalDamagedError
from dressage.proxy.config import JournalConfig
from dressage.proxy.journal import log as journal_log
from dressage.proxy.journal.wal import Scan
from dressage.testing.stack import start_engine, start_proxy
from dressage.trajectory.sample_wire import MSGPACK_MEDIA_TYPE
from dressage_bench.faults.runner import FaultsConfig, case


def _finalized_sessions(url: str, n: int, tag: str) -> list[str]:
    """``n`` sessions of one recorded call each, finalized (acknowledged: their finalize answered 200)."""
    sids = []
    for i in range(n):
        sid = f"{tag}-{i}"
        r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": f"task {i}"}],
                                                           "max_tokens": 8},
                       headers={"X-Session-Id": sid, "X-Instance-Id": f"{tag}{i}"}, timeout=30)
        r.raise_for_status()
        httpx.post(url + "/session/finalize", json={"session_id": sid, "reward": 1.0}, timeout=30).raise_for_status()
        sids.append(sid)
    return sids


def _session(url: str, sid: str) -> None:
    r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "go"}],
                                                       "max_tokens": 8}, headers={"X-Session-Id": sid}, timeout=30)
    r.raise_for_status()


@contextlib.contextmanager
def _full_disk() -> Iterator[None]:
    """Every journal append fails as on a full disk (ENOSPC), inside the block."""
    real = journal_log._write_all

    def full(fd: int, data: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    journal_log._write_all = full
    try:
        yield
    finally:
        journal_log._write_all = real


def _held(stack: Any) -> set[str]:
    httpx.get(stack.url + "/trajectory/stats", timeout=10).raise_for_status()  # after a drain's ack ran
    return set(stack.service.trajectories.finalized)


@case("poisoned_drain")
def poisoned_drain(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    """One session's metadata no msgpack answer can hold (2^64) in a draining read of the whole batch."""
    engine = start_engine()
    stack = start_proxy(engine.url)
    try:
        n = 6 if cfg.quick else 24
        sids = _finalized_sessions(stack.url, n, "pd")
        stack.service.trajectories.finalized[sids[1]].metadata["counter"] = 2 ** 64
        bad = httpx.post(stack.url + "/trajectory/read", json={"drain": True, "format": "samples"},
                         headers={"accept": MSGPACK_MEDIA_TYPE}, timeout=30)
        held_after_failure = _held(stack)
        good = [s for s in sids if s != sids[1]]
        r = httpx.post(stack.url + "/trajectory/read", json={"session_ids": good, "lease": True, "format": "samples"},
                       headers={"accept": MSGPACK_MEDIA_TYPE}, timeout=30)
        answer = msgpack.unpackb(r.content, raw=False)
        read = {t["session_id"] for t in answer["data"]}
        ack = httpx.post(stack.url + "/trajectory/ack", json={"read_id": answer["read_id"]}, timeout=10).json()
        held = _held(stack)
        lost = [s for s in sids if s not in held and not (s in read and ack["acknowledged"] == len(read))]
        detail = {"acknowledged_finalizes": n, "failed_read_status": bad.status_code,
                  "failed_read_code": (bad.json().get("error") or {}).get("code") if bad.status_code >= 400 else None,
                  "held_after_failed_read": len(held_after_failure), "read_after": len(read),
                  "acknowledged_reads": ack["acknowledged"], "still_held": sorted(held),
                  "acknowledged_lost": len(lost)}
        passed = (bad.status_code == 500 and held_after_failure == set(sids) and read == set(good)
                  and held == {sids[1]} and not lost)
        return passed, detail
    finally:
        stack.close()
        engine.stop()


@case("journal_disk_full")
def journal_disk_full(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    """The journal's disk fills under finalize, abort, discard and drain; then space is freed and the
    Proxy restarts from its journal."""
    engine = start_engine()
    with tempfile.TemporaryDirectory() as tmp:
        journal = JournalConfig(path=str(Path(tmp) / "proxy.journal"), fsync="always")
        stack = start_proxy(engine.url, journal=journal)
        restarted = None
        try:
            n = 4 if cfg.quick else 16
            sids = _finalized_sessions(stack.url, n, "df")
            _session(stack.url, "df-open")
            _session(stack.url, "df-abort")
            statuses: dict[str, int] = {}
            with _full_disk():
                statuses["finalize"] = httpx.post(stack.url + "/session/finalize",
                                                  json={"session_id": "df-open", "reward": 1.0}, timeout=30).status_code
                statuses["abort"] = httpx.post(stack.url + "/sessions/df-abort/abort", timeout=30).status_code
                statuses["discard"] = httpx.post(stack.url + "/session/discard", json={"session_id": sids[0]},
                                                 timeout=30).status_code
                drained = httpx.post(stack.url + "/trajectory/read", json={"drain": True}, timeout=30)
                statuses["drain"] = drained.status_code
                held_full = _held(stack)
                states_full = {s: stack.core.state_of(s) for s in ("df-open", "df-abort")}
            # Space is back: the refused calls are retried and the drained batch acknowledged.
            retried = httpx.post(stack.url + "/session/finalize", json={"session_id": "df-open", "reward": 1.0},
                                 timeout=30).status_code
            acked = httpx.post(stack.url + "/trajectory/ack", json={"read_id": drained.json()["read_id"]},
                               timeout=10).json()["acknowledged"]
            stack.close()
            stack = None
            restarted = start_proxy(engine.url, journal=journal)
            held_after = set(restarted.service.trajectories.finalized)
            acknowledged = set(sids) | {"df-open"}
            handed = {t["session_id"] for t in drained.json()["trajectories"]}
            lost = sorted(s for s in acknowledged if s not in held_after and not (s in handed and acked))
            detail = {"acknowledged_finalizes": len(acknowledged), "statuses_on_full_disk": statuses,
                      "held_on_full_disk": len(held_full), "states_on_full_disk": states_full,
                      "finalize_retried": retried, "drain_acknowledged_after": acked,
                      "held_after_restart": sorted(held_after), "acknowledged_lost": len(lost)}
            passed = (statuses == {"finalize": 507, "abort": 507, "discard": 507, "drain": 200}
                      and held_full == set(sids) and states_full == {"df-open": "active", "df-abort": "active"}
                      and retried == 200 and acked == n and held_after == {"df-open"} and not lost)
            return passed, detail
        finally:
            for s in (stack, restarted):
                if s is not None:
                    s.close()
            engine.stop()


@case("journal_mid_flip")
def journal_mid_flip(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    """One flipped byte mid-journal: the Proxy refuses to start, naming the damage and what lies after
    it; ``--journal-recover truncate`` starts on the prefix and keeps the rest aside."""
    from dressage.proxy.journal import codec

    engine = start_engine()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "proxy.journal"
        stack = start_proxy(engine.url, journal=JournalConfig(path=str(path), fsync="never"))
        n = 6 if cfg.quick else 20
        try:
            sids = _finalized_sessions(stack.url, n, "mf")
        finally:
            stack.close()
        frames = [(off, p) for _, p, off in Scan(path)]
        off, _ = frames[len(frames) // 2]
        after = {codec.split(p)[1] for _, p in frames[len(frames) // 2 + 1:]}
        with open(path, "r+b") as f:
            f.seek(off + 30)
            b = f.read(1)
            f.seek(off + 30)
            f.write(bytes([b[0] ^ 0xFF]))
        size = path.stat().st_size
        refused = ""
        try:
            start_proxy(engine.url, journal=JournalConfig(path=str(path), fsync="never")).close()
        except JournalDamagedError as exc:
            refused = str(exc)
        untouched = path.stat().st_size == size
        stack = start_proxy(engine.url, journal=JournalConfig(path=str(path), fsync="never", recover="truncate"))
        try:
            report = stack.proxy.recovery
            held = set(stack.service.trajectories.finalized)
            named = set(report.sessions_after_damage)
            aside = Path(report.set_aside) if report.set_aside else None
            # Lost silently: acknowledged, not replayed, and not named as lying past the damage.
            silent = sorted(s for s in sids if s not in held and s not in named)
            detail = {"acknowledged_finalizes": n, "refused_start": refused[:300], "journal_untouched": untouched,
                      "damage_offset": off, "records_after_damage": report.records_after_damage,
                      "sessions_after_damage": len(named), "replayed_finalized": len(held),
                      "set_aside_bytes": aside.stat().st_size if aside else 0,
                      "acknowledged_lost": len(silent)}
            passed = (f"at byte {off}" in refused and untouched and named == after
                      and set(sids) <= held | named and aside is not None
                      and aside.stat().st_size == size - off and not silent)
            return passed, detail
        finally:
            stack.close()
            engine.stop()
