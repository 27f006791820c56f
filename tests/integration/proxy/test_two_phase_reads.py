"""No acknowledged trajectory is lost: reads are two-phase (lease, ack, release, expiry), a draining read
forgets only what it wrote whole, and finalize / abort / discard / drain change nothing when the journal
cannot be written (a full disk answers 507 and the session stays as it was)."""

from __future__ import annotations

import asyncio
import errno

import httpx
import msgpack
import pytest

from dressage.harness.agents import AgentConfig, make_prompts, run_rollout
from dressage.proxy.config import JournalConfig
from dressage.proxy.journal import log as journal_log
from dressage.errors import LostSamplesError
from dressage.rollout.manager import sample_ref_keys
from dressage.tq import TransferQueue
from group_sessions import read_trajectories, record_session
from dressage.train.remote import ProxyTrajectorySource, consume
from dressage.trajectory.sample_wire import MSGPACK_MEDIA_TYPE


def _unread(proxy) -> list[str]:
    """The trajectories the Proxy holds, asked after an HTTP call (a draining read forgets once it answered)."""
    assert httpx.get(proxy.url + "/trajectory/stats", timeout=10).status_code == 200
    return sorted(proxy.service.trajectories.finalized)


def _ids(answer: dict) -> list[str]:
    return sorted(t["session_id"] for t in answer["trajectories"])


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_leased_read_is_skipped_by_batch_reads_until_acked_and_an_ack_repeats(engine, proxy_stack):
    proxy = proxy_stack(engine.url)
    for i in range(3):
        record_session(proxy.url, f"s-{i}", str(i))
    first = read_trajectories(proxy.url, lease=True)
    assert _ids(first) == ["s-0", "s-1", "s-2"] and first["lease_s"] == 600.0
    assert read_trajectories(proxy.url, lease=True)["trajectories"] == []  # held by the first read
    record_session(proxy.url, "s-3", "3")
    assert _ids(read_trajectories(proxy.url, lease=True)) == ["s-3"]  # only what no read holds
    r = httpx.post(proxy.url + "/trajectory/ack", json={"read_id": first["read_id"]}, timeout=10)
    assert r.status_code == 200 and r.json()["acknowledged"] == 3
    assert sorted(proxy.service.trajectories.finalized) == ["s-3"]
    again = httpx.post(proxy.url + "/trajectory/ack", json={"read_id": first["read_id"]}, timeout=10).json()
    assert again["acknowledged"] == 0 and again["already"] is True
    r = httpx.post(proxy.url + "/trajectory/ack", json={"read_id": "never-granted"}, timeout=10)
    assert r.status_code == 404
    r = httpx.post(proxy.url + "/trajectory/ack", json={"read_id": first["read_id"], "x": 1}, timeout=10)
    assert r.status_code == 400


def test_an_expired_or_released_lease_makes_its_trajectories_readable_again(engine, proxy_stack):
    proxy = proxy_stack(engine.url, lease_s=30.0)
    clock = proxy.service.trajectories.leases.clock = _Clock()
    for i in range(2):
        record_session(proxy.url, f"s-{i}", str(i))
    first = read_trajectories(proxy.url, lease=True)
    assert first["lease_s"] == 30.0 and read_trajectories(proxy.url, lease=True)["trajectories"] == []
    clock.now += 31.0
    second = read_trajectories(proxy.url, lease=True, lease_s=5)
    assert _ids(second) == ["s-0", "s-1"]
    r = httpx.post(proxy.url + "/trajectory/ack", json={"read_id": first["read_id"]}, timeout=10)
    assert r.status_code == 409 and "expired" in r.text  # its reader learns they went out again
    released = httpx.post(proxy.url + "/trajectory/release", json={"read_id": second["read_id"]}, timeout=10)
    assert released.status_code == 200 and released.json()["released"] == 2
    assert _ids(read_trajectories(proxy.url, drain=True)) == ["s-0", "s-1"]
    assert _unread(proxy) == []
    assert httpx.post(proxy.url + "/trajectory/read", json={"lease": True, "lease_s": 0}, timeout=10).status_code == 400


def _post(proxy, path: str, read_id: str) -> dict:
    r = httpx.post(proxy.url + path, json={"read_id": read_id}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_named_read_takes_its_sessions_from_another_lease_and_the_ack_says_which(engine, proxy_stack):
    proxy = proxy_stack(engine.url)
    for i in range(2):
        record_session(proxy.url, f"s-{i}", str(i))
    first = read_trajectories(proxy.url, lease=True)
    named = read_trajectories(proxy.url, session_ids=["s-1"], lease=True)
    assert _ids(named) == ["s-1"]
    ack = _post(proxy, "/trajectory/ack", first["read_id"])
    assert ack["acknowledged"] == 1 and sorted(proxy.service.trajectories.finalized) == ["s-1"]
    # The batch reader learns which sessions (and so which TQ keys) are its own, also on a repeat.
    assert ack["acknowledged_session_ids"] == ["s-0"] and ack["taken_over"] == ["s-1"]
    again = _post(proxy, "/trajectory/ack", first["read_id"])
    assert again["already"] is True and again["acknowledged_session_ids"] == ["s-0"]
    # A read that lost every session to a named read acknowledges none, and hands none back.
    record_session(proxy.url, "s-2", "2")
    second = read_trajectories(proxy.url, lease=True)
    assert _ids(second) == ["s-2"]
    read_trajectories(proxy.url, session_id="s-2", lease=True)
    ack = _post(proxy, "/trajectory/ack", second["read_id"])
    assert (ack["acknowledged"], ack["acknowledged_session_ids"], ack["taken_over"]) == (0, [], ["s-2"])
    released = _post(proxy, "/trajectory/release", second["read_id"])
    assert (released["released"], released["session_ids"], released["taken_over"]) == (0, [], ["s-2"])
    assert sorted(proxy.service.trajectories.finalized) == ["s-1", "s-2"]  # the named reads hold them


def test_an_ack_whose_journal_write_fails_forgets_none_and_its_repeat_forgets_all(engine, proxy_stack, tmp_path,
                                                                                  monkeypatch):
    proxy = proxy_stack(engine.url, journal=JournalConfig(path=str(tmp_path / "proxy.journal"), fsync="never"))
    for i in range(3):
        record_session(proxy.url, f"s-{i}", str(i))
    first, second = (read_trajectories(proxy.url, session_ids=ids, lease=True)
                     for ids in (["s-0", "s-1"], ["s-2"]))
    _fail_writes(monkeypatch)
    r = httpx.post(proxy.url + "/trajectory/ack", json={"read_id": first["read_id"]}, timeout=10)
    assert r.status_code == 507 and sorted(proxy.service.trajectories.finalized) == ["s-0", "s-1", "s-2"]
    assert proxy.service.trajectories.leases.held("s-0") == first["read_id"]  # still this read's, all of them
    monkeypatch.undo()
    ack = _post(proxy, "/trajectory/ack", first["read_id"])  # the repeat forgets them, together
    assert ack["acknowledged"] == 2 and ack["acknowledged_session_ids"] == ["s-0", "s-1"]
    _post(proxy, "/trajectory/ack", second["read_id"])
    released = _post(proxy, "/trajectory/release", second["read_id"])  # an ack whose answer was lost
    assert released["released"] == 0 and released["acknowledged_session_ids"] == ["s-2"]
    assert proxy.service.trajectories.finalized == {}


@pytest.mark.parametrize("binary", [True, False])
def test_a_poisoned_drain_forgets_nothing_and_the_rest_stays_readable(engine, proxy_stack, binary):
    proxy = proxy_stack(engine.url)
    for i in range(3):
        record_session(proxy.url, f"s-{i}", str(i))
    done = proxy.service.trajectories.finalized["s-1"]
    if binary:
        done.metadata["big"] = 2 ** 64  # no msgpack integer holds it
    else:
        nested: list = []
        for _ in range(5000):
            nested = [nested]
        done.metadata["deep"] = nested  # deeper than any JSON encoder goes
    headers = {"accept": MSGPACK_MEDIA_TYPE} if binary else {}
    r = httpx.post(proxy.url + "/trajectory/read", json={"drain": True}, headers=headers, timeout=30)
    assert r.status_code == 500 and "answer_not_encodable" in r.text
    assert sorted(proxy.service.trajectories.finalized) == ["s-0", "s-1", "s-2"]
    assert len(proxy.service.trajectories.leases) == 0  # the failed read holds nothing
    r = httpx.post(proxy.url + "/trajectory/read", json={"session_ids": ["s-0", "s-2"], "drain": True},
                   headers=headers, timeout=30)
    assert r.status_code == 200
    body = msgpack.unpackb(r.content, raw=False) if binary else r.json()
    assert _ids(body) == ["s-0", "s-2"]
    assert _unread(proxy) == ["s-1"]


def _fail_writes(monkeypatch, code: int = errno.ENOSPC) -> None:
    def full(fd, data):
        raise OSError(code, "No space left on device" if code == errno.ENOSPC else "Input/output error")

    monkeypatch.setattr(journal_log, "_write_all", full)


def test_a_full_disk_under_finalize_abort_discard_and_drain_changes_nothing(engine, proxy_stack, tmp_path,
                                                                           monkeypatch):
    path = tmp_path / "proxy.journal"
    proxy = proxy_stack(engine.url, journal=JournalConfig(path=str(path), fsync="always"))
    for i in range(3):
        record_session(proxy.url, f"s-{i}", str(i))
    record_session(proxy.url, "active", "9", finalize=False)
    record_session(proxy.url, "to-abort", "9", finalize=False)
    size = path.stat().st_size
    real_write = journal_log._write_all
    _fail_writes(monkeypatch)
    r = httpx.post(proxy.url + "/session/finalize", json={"session_id": "active", "reward": 1.0}, timeout=30)
    assert r.status_code == 507 and "journal_disk_full" in r.text
    assert proxy.service.core.session("active").state == "active"
    assert proxy.service.trajectories.ledger.get("active") is None
    r = httpx.post(proxy.url + "/sessions/to-abort/abort", timeout=30)
    assert r.status_code == 507 and proxy.service.core.session("to-abort").state == "active"
    r = httpx.post(proxy.url + "/session/discard", json={"session_id": "s-2"}, timeout=30)
    assert r.status_code == 507 and "s-2" in proxy.service.trajectories.finalized
    drained = read_trajectories(proxy.url, drain=True)  # written whole; forgetting it cannot be journaled
    assert _ids(drained) == ["s-0", "s-1", "s-2"]
    assert _unread(proxy) == ["s-0", "s-1", "s-2"]
    r = httpx.post(proxy.url + "/trajectory/ack", json={"read_id": drained["read_id"]}, timeout=10)
    assert r.status_code == 507 and sorted(proxy.service.trajectories.finalized) == ["s-0", "s-1", "s-2"]
    _fail_writes(monkeypatch, errno.EIO)
    r = httpx.post(proxy.url + "/session/finalize", json={"session_id": "active"}, timeout=30)
    assert r.status_code == 503 and "journal_unavailable" in r.text
    assert path.stat().st_size == size  # no half-written record left behind
    monkeypatch.setattr(journal_log, "_write_all", real_write)  # space freed: every call may be retried
    r = httpx.post(proxy.url + "/session/finalize", json={"session_id": "active", "reward": 1.0}, timeout=30)
    assert r.status_code == 200 and r.json()["session_id"] == "active"
    assert httpx.post(proxy.url + "/sessions/to-abort/abort", timeout=30).status_code == 200
    r = httpx.post(proxy.url + "/trajectory/ack", json={"read_id": drained["read_id"]}, timeout=10)
    assert r.status_code == 200 and r.json()["acknowledged"] == 3
    assert sorted(proxy.service.trajectories.finalized) == ["active"]


def test_the_trainer_acknowledges_after_restore_and_a_failed_restore_leaves_the_batch(engine, proxy_stack):
    tq = TransferQueue.start({"deployment": "embedded", "num_storage_units": 1, "retention_s": None})
    try:
        proxy = proxy_stack(engine.url, tq=tq, routed_experts_dtype="uint8", request_timeout_s=600)
        asyncio.run(run_rollout(proxy.url, make_prompts(2, seed=4, max_background_words=0), 1,
                                AgentConfig(max_turns=2, seed=2), concurrency=2))
        unread = sorted(proxy.service.trajectories.finalized)
        assert len(unread) == 2
        source = ProxyTrajectorySource(proxy.url)
        peek = source.read()
        lost = peek.samples[0].session_id
        tq.client().delete(sorted(sample_ref_keys([s for s in peek.samples if s.session_id == lost]))[:1])
        with pytest.raises(LostSamplesError):
            consume(source, on_lost="fail")
        assert sorted(proxy.service.trajectories.finalized) == unread  # nothing acknowledged, nothing lost
        assert len(proxy.service.trajectories.leases) == 0  # released at once, not left to expire
        assert httpx.post(proxy.url + "/session/discard", json={"session_id": lost}, timeout=10).status_code == 200
        report = consume(source, on_lost="fail")
        assert report["sessions"] == 1 and report["acknowledged"] == 1 and report["tq_keys_left"] == 0
        assert proxy.service.trajectories.finalized == {}
        source.close()
    finally:
        tq.shutdown()


def test_a_leased_read_the_trainer_cannot_decode_is_released_at_once(engine, proxy_stack, monkeypatch):
    import dressage.train.remote as remote
    from dressage.errors import SampleWireError

    proxy = proxy_stack(engine.url)
    for i in range(2):
        record_session(proxy.url, f"d-{i}", str(i))

    def undecodable(obj):
        raise SampleWireError("group_index must be an integer, got 'zzz'")

    source = ProxyTrajectorySource(proxy.url)
    with monkeypatch.context() as m:
        m.setattr(remote, "sample_from_wire", undecodable)
        with pytest.raises(SampleWireError, match="trajectory 'd-0': group_index"):
            source.read(lease=True)
    stats = httpx.get(proxy.url + "/trajectory/stats", timeout=10).json()
    assert stats["leased_reads"] == 0 and _unread(proxy) == ["d-0", "d-1"]
    batch = source.read(lease=True)  # readable again at once, not after the lease's 600 s
    assert sorted(s.session_id for s in batch.samples) == ["d-0", "d-1"] and batch.read_id is not None
    assert source.ack(batch) == 2
