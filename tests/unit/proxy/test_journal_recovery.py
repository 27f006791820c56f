"""Recovery that says what it did: a journal damaged mid-file is refused (offset, records and sessions
after it named) until ``journal repair`` or ``--journal-recover truncate``; a replayed journal whose TQ
keys are gone marks those trajectories (keys a finalize released on purpose are not lost); finalize /
abort / discard / forget journal before they change memory, so a failed write leaves the session, and a
replay, as they were; a step whose write lands after its session ended is refused before it is journaled,
and a journal an older Proxy wrote such a step into replays without it."""

from __future__ import annotations

import errno
from types import SimpleNamespace

import numpy as np
import pytest

from dressage.cli.journal import repair
from dressage.errors import (JournalDamagedError, JournalError, JournalFullError, JournalWriteError, SessionStateError,
                             TransferQueueError, UnknownReadError)
from dressage.proxy.config import DataPlaneConfig, EnginesConfig, JournalConfig, ProxyConfig
from dressage.proxy.deployment import build_service
from dressage.proxy.journal import log as journal_log
from dressage.proxy.journal.log import Journal
from dressage.proxy.journal.wal import BLOCK, Scan
from dressage.proxy.recording.core import LOST_FIELDS_KEY, ProxyCore
from dressage.rollout import RolloutManager
from dressage.rollout.manager import sample_ref_keys
from dressage.tokenizer import load_tokenizer
from dressage.tq import TransferQueue
from dressage.train import TrainingReader, release_batch, samples_digest
from test_journal_wal import _cfg, _frames, _journal_of, _state
from test_offload import MODEL, SCRIPT, _config, _drive
from test_write_behind import _begin, _Gated
from trajgen import sglang_body


def _service(path, recover="refuse", tq=None):
    cfg = ProxyConfig(data_plane=_cfg(), journal=JournalConfig(path=str(path), fsync="never", recover=recover),
                      engines=EnginesConfig(engine_url="http://127.0.0.1:9"))
    return build_service(cfg, tokenizer=load_tokenizer("byte"), tq_client=tq)


def _flip_mid(path) -> tuple[int, int, set[str]]:
    """Flip a byte in a record near the middle; returns its offset, the records and sessions after it."""
    from dressage.proxy.journal import codec

    frames = [(off, p) for _, p, off in Scan(path)]
    off, payload = frames[len(frames) // 2]
    after = frames[len(frames) // 2 + 1:]
    with open(path, "r+b") as f:
        f.seek(off + 30)
        b = f.read(1)
        f.seek(off + 30)
        f.write(bytes([b[0] ^ 0xFF]))
    return off, len(after), {codec.split(p)[1] for _, p in after}


def test_a_mid_journal_flip_is_refused_naming_the_offset_and_what_lies_after(tmp_path):
    path = tmp_path / "j"
    _journal_of(path, sessions=4)
    off, records_after, sessions_after = _flip_mid(path)
    size = path.stat().st_size
    with pytest.raises(JournalDamagedError) as err:
        _service(path)
    msg = str(err.value)
    assert f"at byte {off}" in msg and f"{records_after} intact records of {len(sessions_after)} sessions" in msg
    assert "journal repair" in msg and "--journal-recover truncate" in msg
    assert path.stat().st_size == size and not list(tmp_path.glob("j.damaged-*"))  # nothing touched
    service, report = _service(path, recover="truncate")  # the explicit choice starts on the prefix
    assert report.records_after_damage == records_after and set(report.sessions_after_damage) == sessions_after
    assert report.set_aside == str(tmp_path / f"j.damaged-{off}") and path.stat().st_size == off
    assert f"at byte {off}" in report.summary() and "set aside" in report.summary()
    service.core.journal.close()
    _, again = Journal.replay(path)
    assert again.damage is None  # the next start is clean


def test_journal_repair_lets_the_proxy_start_on_the_intact_prefix(tmp_path):
    path = tmp_path / "j"
    _journal_of(path, sessions=4)
    off, records_after, sessions_after = _flip_mid(path)
    out = repair(path)
    assert out["before"]["damage"]["offset"] == off and out["before"]["frames_after_damage"] == records_after
    assert out["before"]["sessions_after_damage"] == len(sessions_after) > 0
    assert out["after"]["ok"] and out["set_aside"] == str(tmp_path / f"j.damaged-{off}")
    service, report = _service(path)
    assert report.damage is None and report.records == out["after"]["records"]
    service.core.journal.close()


def test_a_torn_tail_still_starts_without_asking(tmp_path):
    path = tmp_path / "j"
    _journal_of(path, sessions=2)
    with open(path, "ab") as f:
        f.write(b"\xd5J\x10\x00")  # a crash mid-append
    service, report = _service(path)
    assert report.truncated_tail and not report.mid_journal_damage
    service.core.journal.close()


def _tq_core(path, tq):
    cfg = DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=True,
                          routed_experts_dtype="uint8")
    core = ProxyCore(cfg, tq.client(), journal=Journal(path, fsync="never"), write_behind=False)
    for g in range(2):
        _drive(core, SCRIPT, group=g)
    core.journal.close()
    return cfg, core


def test_a_replay_whose_tq_keys_are_gone_marks_those_trajectories(tmp_path):
    path = tmp_path / "j"
    old = TransferQueue.start({"deployment": "embedded", "num_storage_units": 1, "retention_s": None})
    try:
        cfg, core = _tq_core(path, old)
        finalized = sorted(sid for sid, s in core.sessions.items() if s.state == "finalized")
        assert len(finalized) == 2
        keep = finalized[0]
        gone = [r.key for r in core.sessions[finalized[-1]].large_field_refs()]
        old.client().delete(gone)
        fresh = ProxyCore(cfg, old.client())
        report = fresh.recover(path)
        assert list(report.lost_fields) == [finalized[-1]] and sorted(report.lost_fields[finalized[-1]]) == sorted(
            set(gone))
        by_id = {d.session_id: d for d in report.delivered}
        assert by_id[finalized[-1]].metadata[LOST_FIELDS_KEY] == len(set(gone))
        assert LOST_FIELDS_KEY not in by_id[keep].metadata
        assert "no longer holds" in report.summary()

        def unreachable(keys):
            raise TransferQueueError("controller did not answer")

        blind = ProxyCore(cfg, SimpleNamespace(_controller=SimpleNamespace(where=unreachable)))
        report = blind.recover(path)  # nothing is marked on a guess; the start says why it could not check
        assert report.lost_fields == {} and "controller did not answer" in report.tq_check_error
        assert all(LOST_FIELDS_KEY not in d.metadata for d in report.delivered) and len(report.delivered) == 2
    finally:
        old.shutdown()


def test_a_replayed_active_session_whose_tq_keys_are_gone_hands_the_mark_to_its_finalize(tmp_path):
    path = tmp_path / "j"
    old = TransferQueue.start({"deployment": "embedded", "num_storage_units": 1, "retention_s": None})
    try:
        cfg = DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=True,
                              routed_experts_dtype="uint8")
        core = ProxyCore(cfg, old.client(), journal=Journal(path, fsync="never"), write_behind=False)
        live, kept = (core.create_session({"group_index": g}) for g in range(2))
        for s in (live, kept):
            prompt = np.asarray([1, 2, 3, 4], np.int32)
            d = core.plan(s.session_id, prompt)
            core.ingest(s.session_id, d, sglang_body(prompt, [5, 6, 7], start=d.routed_experts_start, salt=1),
                        prompt_ids=prompt, version=0)
        core.journal.close()
        gone = sorted({r.key for r in live.large_field_refs()})
        old.client().delete(gone)  # a TransferQueue that did not outlive the Proxy, for this session
        fresh = ProxyCore(cfg, old.client())
        report = fresh.recover(path)
        assert sorted(report.active) == sorted([live.session_id, kept.session_id])
        assert report.lost_fields == {live.session_id: gone} and "2 sessions active" in report.summary()
        assert fresh.sessions[live.session_id].metadata[LOST_FIELDS_KEY] == len(gone)
        assert LOST_FIELDS_KEY not in fresh.sessions[kept.session_id].metadata
        done = fresh.finalize(live.session_id, reward=1.0)  # its Samples say what their refs point at
        assert done.metadata[LOST_FIELDS_KEY] == len(gone)
        assert LOST_FIELDS_KEY not in fresh.finalize(kept.session_id, reward=1.0).metadata
    finally:
        old.shutdown()


def test_a_finalize_keeps_its_finalization_id_across_a_replay(tmp_path):
    from dressage.proxy.upstream.read import finalization_id

    path = tmp_path / "j"
    cfg = DataPlaneConfig(model=MODEL)
    delivered = []
    core = ProxyCore(cfg, None, journal=Journal(path, fsync="never"), write_behind=False, sink=delivered.append)
    sessions = [_drive(core, SCRIPT, group=g) for g in range(2)]
    core.journal.close()
    ids = {d.session_id: finalization_id(d) for d in delivered}
    assert len(set(ids.values())) == 2 and all(ids[s.session_id] == s.finalization_id for s in sessions)
    for _ in range(2):  # every restart hands the same finalizations over
        report = ProxyCore(cfg, None).recover(path)
        assert {d.session_id: finalization_id(d) for d in report.delivered} == ids


def _full(monkeypatch, code=errno.ENOSPC):
    def fail(fd, data):
        raise OSError(code, "No space left on device")

    monkeypatch.setattr(journal_log, "_write_all", fail)


def test_a_failed_journal_write_leaves_the_session_and_the_replay_as_they_were(tmp_path, monkeypatch):
    path = tmp_path / "j"
    core = ProxyCore(_cfg(), None, journal=Journal(path, fsync="always"))
    live = core.create_session({"group_index": 1})
    prompt = np.asarray([1, 2, 3], np.int32)
    core.ingest(live.session_id, core.plan(live.session_id, prompt), sglang_body(prompt, [40, 41], start=0),
                prompt_ids=prompt)
    sid = live.session_id
    size = path.stat().st_size
    _full(monkeypatch)
    with pytest.raises(JournalFullError):
        core.finalize(sid, 1.0, metadata={"instance_id": "7"})
    s = core.session(sid)
    assert s.state == "active" and s.reward is None and "instance_id" not in s.metadata
    with pytest.raises(JournalFullError):
        core.abort(sid)
    assert core.session(sid).state == "active"
    with pytest.raises(JournalFullError):
        core.discard(sid)
    assert core.session(sid).state == "active"
    _full(monkeypatch, errno.EIO)
    with pytest.raises(JournalWriteError) as err:
        core.finalize(sid, 1.0)
    assert not isinstance(err.value, JournalFullError) and err.value.http_status == 503
    assert path.stat().st_size == size
    monkeypatch.undo()
    core.finalize(sid, 0.5, metadata={"instance_id": "7"})
    _full(monkeypatch)
    with pytest.raises(JournalFullError):
        core.forget(sid)
    assert sid in core.sessions
    monkeypatch.undo()
    core.journal.close()
    sessions, report = Journal.replay(path)
    assert report.damage is None and sessions[sid].state == "finalized" and sessions[sid].reward == 0.5
    assert sessions[sid].metadata["instance_id"] == "7"  # the finalize's metadata is journaled with it
    with pytest.raises(SessionStateError):
        core.finalize(sid, 1.0)


def test_a_journal_belongs_to_one_proxy_at_a_time(tmp_path):
    path = tmp_path / "j"
    first = Journal(path, fsync="never")
    with pytest.raises(JournalError, match="in use by another process"):
        Journal(path, fsync="never")  # a second Proxy, or `journal repair` beside a running one
    with pytest.raises(JournalError, match="in use by another process"):
        repair(path)
    first.close()
    Journal(path, fsync="never").close()  # free again once the first one closed (or its process ended)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(JournalError, match="cannot open journal"):  # a parent that cannot be made
        Journal(blocked / "sub" / "j", fsync="never")


@pytest.mark.parametrize("end", ["abort", "discard", "finalize"])
def test_a_step_whose_write_lands_after_its_session_ended_is_refused_before_the_journal(tmp_path, tq, monkeypatch,
                                                                                        end):
    path = tmp_path / "j"
    client = _Gated(tq.client())
    core = ProxyCore(_config(True, dtype="uint8"), client, journal=Journal(path, fsync="never"))
    sid = core.create_session().session_id
    first = _begin(core, sid, [1, 2, 3], [40, 41]).result(10)
    client.gate.clear()  # the next call answered; its TQ write is still on the wire
    late = _begin(core, sid, np.concatenate([first.full_ids, [7]]), [50])
    if end == "finalize":  # the call answered between finalize's wait for the session's writes and its record
        monkeypatch.setattr(core, "_settle", lambda session_id: None)
        core.finalize(sid, reward=1.0)
        monkeypatch.undo()
    else:
        getattr(core, end)(sid)
    client.gate.set()
    with pytest.raises(SessionStateError, match="it takes no more steps"):
        late.result(10)
    later = core.create_session().session_id
    _begin(core, later, [4, 5, 6], [60, 61]).result(10)
    core.finalize(later, reward=2.0)
    core.close()
    sessions, report = Journal.replay(path)
    assert report.damage is None and report.ended_steps == [] and report.records == 6
    assert (sessions[later].state, sessions[later].reward, len(sessions[later].steps)) == ("finalized", 2.0, 1)
    assert sessions[sid].state == ("finalized" if end == "finalize" else "aborted") and len(sessions[sid].steps) == 1
    # the refused step's keys went with it: what is left is the finalized sessions' steps
    assert tq.total_keys() == (4 if end == "finalize" else 2)


def _late_step(core):
    """A session with one recorded step, and a second step prepared but not recorded: (session, its
    route decision, the StepRecord), as a Proxy held them while the step's TQ write was on the wire."""
    s = core.create_session()
    first = np.asarray([1, 2, 3], np.int32)
    core.ingest(s.session_id, core.plan(s.session_id, first), sglang_body(first, [40, 41], start=0), prompt_ids=first)
    prompt = np.concatenate([s.steps[0].full_ids, [7]]).astype(np.int32)
    d = core.plan(s.session_id, prompt)
    out = core.normalize(sglang_body(prompt, [50], start=d.routed_experts_start), prompt_len=len(prompt), decision=d)
    return s, d, s.prepare_step(d, prompt_ids=prompt, response_ids=out.output_ids, logprobs=out.logprobs,
                                routed_experts=out.routed_experts)


def _finalized_later(core):
    """Another session, one step, finalized with reward 2.0: what the journal holds after the late step."""
    later = core.create_session({"group_index": 3}).session_id
    first = np.asarray([1, 2, 3], np.int32)
    core.ingest(later, core.plan(later, first), sglang_body(first, [42], start=0), prompt_ids=first)
    core.finalize(later, reward=2.0)
    return later


def test_a_journal_with_a_step_after_its_sessions_end_replays_without_it(tmp_path):
    path = tmp_path / "j"
    core = ProxyCore(_cfg(), None, journal=Journal(path, fsync="never"))
    s, d, late = _late_step(core)
    sid = s.session_id
    core.discard(sid)
    core.journal.step(sid, d, late, s)  # what a Proxy that journaled before checking the session wrote
    later = _finalized_later(core)
    core.journal.close()
    sessions, report = Journal.replay(path)
    assert report.damage is None and report.ended_steps == [sid] and report.records == 7
    assert sessions[sid].state == "aborted" and len(sessions[sid].steps) == 1
    assert sessions[later].state == "finalized" and sessions[later].reward == 2.0
    assert f"1 step records of 1 sessions that had ended before them were skipped (never recorded: {sid})" in \
        report.summary()
    service, report = _service(path)  # the Proxy starts on it, the later finalize there to read
    assert list(service.trajectories.finalized) == [later] and service.core.state_of(sid) == "aborted"
    assert report.ended_steps == [sid]
    service.core.journal.close()


def test_a_journal_with_a_step_after_its_session_was_acknowledged_replays_past_it(tmp_path):
    # An old Proxy could journal a step whose session a read acknowledged (and forgot) meanwhile; it then
    # refused the step. Replay skips that record, as one behind an ended session, instead of stopping there
    # and losing every session the journal holds after it.
    path = tmp_path / "j"
    core = ProxyCore(_cfg(), None, journal=Journal(path, fsync="never"))
    s, d, late = _late_step(core)
    sid = s.session_id
    core.finalize(sid, reward=1.0)
    core.journal.forgotten(sid, read_id="read-1")  # a read acknowledged it
    core.journal.step(sid, d, late, s)  # what such a Proxy wrote after
    later = _finalized_later(core)
    core.journal.close()
    sessions, report = Journal.replay(path)
    assert report.damage is None and report.ended_steps == [sid]
    assert sid not in sessions and report.acknowledged_reads == {"read-1": [sid]}
    assert sessions[later].state == "finalized" and sessions[later].reward == 2.0 and len(sessions[later].steps) == 1
    # A step of an id the journal never created is still damage: replay stops there.
    stray = tmp_path / "stray"
    other = ProxyCore(_cfg(), None, journal=Journal(stray, fsync="never"))
    other.journal.step("never-created", d, late, s)
    other.journal.close()
    sessions, report = Journal.replay(stray)
    assert report.damage is not None and report.ended_steps == [] and not sessions


def test_retry_orphans_released_at_finalize_are_not_lost_after_a_replay(tmp_path, tq):
    path = tmp_path / "j"
    cfg = _config(True, dtype="uint8", drop=True)
    before = RolloutManager(dp_size=1)
    core = ProxyCore(cfg, tq.client(), journal=Journal(path, fsync="never"), write_behind=False, sink=before)
    retried = [(0, "extend", [], [40, 41]), (0, "retry", [], [50, 51]), (1, "extend", [20, 21], [42, 43])]
    s = _drive(core, retried)
    assert s.retry_orphans() == {0} and tq.total_keys() == 4  # step 0's two keys released at finalize
    core.journal.close()
    after = RolloutManager(dp_size=1)
    report = ProxyCore(cfg, tq.client(), sink=after).recover(path)
    assert report.lost_fields == {} and "no longer holds" not in report.summary()
    assert [d.session_id for d in report.delivered] == [s.session_id]
    assert LOST_FIELDS_KEY not in report.delivered[0].metadata and len(report.delivered[0].released_refs) == 2
    client = tq.client()
    samples, keys = {}, {}
    for name, rm in (("before", before), ("after", after)):
        batch = rm.take_batch(0)
        assert not any(LOST_FIELDS_KEY in x.metadata for x in batch.samples)
        keys[name] = sample_ref_keys(batch.samples)
        samples[name] = [x for shard in batch.shards for x in TrainingReader(client).restore(shard)]
    assert len(samples["after"]) == 1 and samples_digest(samples["after"]) == samples_digest(samples["before"])
    assert keys["after"] == keys["before"] and release_batch(client, keys["after"]) == 4 and tq.total_keys() == 0


def test_a_session_dropped_as_unused_takes_no_step_landing_after_it(tmp_path, tq, monkeypatch):
    path = tmp_path / "j"
    client = _Gated(tq.client())
    core = ProxyCore(_config(True, dtype="uint8"), client, journal=Journal(path, fsync="never"))
    sid = core.create_session().session_id
    client.gate.clear()
    pending = _begin(core, sid, [1, 2, 3], [40, 41])
    assert core.drop_unused(sid) is False  # a step of it is being written: it is not unused
    # a call that got past its session check just before the drop, and queued its write just after
    monkeypatch.setattr(core.write_behind, "futures", lambda session_id: [])
    assert core.drop_unused(sid) is True
    client.gate.set()
    with pytest.raises(SessionStateError, match="was dropped"):
        pending.result(10)
    core.close()
    sessions, report = Journal.replay(path)
    assert report.damage is None and sessions == {} and report.records == 2 and tq.total_keys() == 0

def test_an_ack_is_one_journal_record_so_a_crash_forgets_all_of_it_or_none(tmp_path):
    """A SIGKILL while an ack is written leaves its record whole or torn: after the restart every
    trajectory the ack did not get to forget is readable again, as it was; once the record is on disk, all
    of them are forgotten and a repeat of the ack (its answer was lost with the process) names them."""
    path = tmp_path / "j"
    _journal_of(path, sessions=6)
    before, _ = Journal.replay(path)
    service, _ = _service(path)
    finalized = sorted(service.trajectories.finalized)
    assert len(finalized) == 6
    read = service.trajectories.read(lease=True)
    records, size = len(_frames(path)), path.stat().st_size
    answer = service.trajectories.ack(read["read_id"])
    assert sorted(answer["acknowledged_session_ids"]) == finalized and answer["acknowledged"] == 6
    service.core.journal.close()
    data = path.read_bytes()
    for cut in range(size, len(data)):  # killed at every byte of what the ack wrote
        path.write_bytes(data[:cut])
        sessions, report = Journal.replay(path)
        assert report.damage is None or report.truncated_tail
        assert _state(sessions) == _state(before), f"killed at byte {cut - size} of the ack"
    assert not report.acknowledged_reads
    path.write_bytes(data)
    assert len(_frames(path)) == records + 1  # the whole ack: one record
    path.write_bytes(data[:size + 40])
    restarted, report = _service(path)  # readable again, every one, and the read id is unknown
    assert report.truncated_tail and sorted(restarted.trajectories.finalized) == finalized
    assert sorted(t["session_id"] for t in restarted.trajectories.read(lease=True)["trajectories"]) == finalized
    with pytest.raises(UnknownReadError):
        restarted.trajectories.ack(read["read_id"])
    restarted.core.journal.close()

    path.write_bytes(data)  # the record reached the disk, the answer did not
    restarted, report = _service(path)
    assert restarted.trajectories.finalized == {} and list(report.acknowledged_reads) == [read["read_id"]]
    again = restarted.trajectories.ack(read["read_id"])
    assert again["already"] is True and sorted(again["acknowledged_session_ids"]) == finalized
    released = restarted.trajectories.release(read["read_id"])
    assert released["released"] == 0 and sorted(released["acknowledged_session_ids"]) == finalized
    restarted.core.journal.compact()  # the acknowledged sessions' records, and the ack's, are dropped
    restarted.core.journal.close()
    sessions, report = Journal.replay(path)
    assert report.damage is None and list(sessions) == report.active and len(report.active) == 1
    assert report.records == 2 and not report.acknowledged_reads


def test_a_journal_that_forgot_an_ack_session_by_session_still_replays(tmp_path):
    """The previous version journaled an ack as one ``forget`` record per session: such a journal
    replays with those sessions forgotten, and a compaction drops them."""
    from dressage.proxy.journal import codec

    path = tmp_path / "j"
    core = _journal_of(path, sessions=3)
    done = sorted(sid for sid, s in core.sessions.items() if s.state == "finalized")
    j = Journal(path, fsync="never", compact_min_bytes=None)
    for sid in done[:2]:
        j._append(codec.encode("forget", sid, None))
    sessions, report = Journal.replay(path)
    assert report.damage is None and sorted(report.finalized) == done[2:] and len(report.active) == 1
    j.compact()
    j.close()
    compacted, again = Journal.replay(path)
    assert again.damage is None and _state(compacted) == _state(sessions)
    assert not any(codec.split(p)[1] in done[:2] for _, p, _ in Scan(path))


@pytest.mark.parametrize("tail", ["cut last frame", "last frame zeroed", "4 KiB of zeros after the last frame",
                                  "header zeroed"])
def test_a_tail_a_crash_leaves_starts_as_a_torn_tail(tmp_path, tail):
    """Killed mid-write, the last frame is cut short; after a power loss its bytes (or the bytes after it)
    may read as zeros, the file's size having reached the disk and its last blocks not. Nothing intact
    follows either: the Proxy starts on the records before it, as from any torn tail."""
    path = tmp_path / "j"
    _journal_of(path, sessions=3)
    frames = _frames(path)
    data = path.read_bytes()
    last = frames[-1][0]
    block = next((o for o in range(last + 1, len(data)) if o % BLOCK == 0), last)  # lost from a block start on
    path.write_bytes({"cut last frame": data[:-30], "last frame zeroed": data[:block] + bytes(len(data) - block),
                      "4 KiB of zeros after the last frame": data + bytes(4096),
                      "header zeroed": data[:last] + bytes(len(data) - last)}[tail])
    intact = len(data) if tail.startswith("4 KiB") else last
    service, report = _service(path)
    assert report.truncated_tail and not report.mid_journal_damage and report.damage.kind == "torn_tail"
    assert report.damage.offset == report.intact_bytes == intact and service.core.journal.set_aside is None
    assert report.records == len(frames) - (0 if tail.startswith("4 KiB") else 1)
    assert path.stat().st_size == intact  # cut back before the next append
    service.core.journal.close()


@pytest.mark.parametrize("tail", ["flipped byte in the last frame", "zeros, then an intact frame",
                                  "flipped byte in a last frame whose bytes end in zeros"])
def test_damage_at_the_end_that_a_crash_does_not_leave_is_still_refused(tmp_path, tail):
    path = tmp_path / "j"
    _journal_of(path, sessions=3)
    frames = _frames(path)
    data = bytearray(path.read_bytes())
    (last, _), (before_last, n) = frames[-1], frames[-2]
    if tail == "flipped byte in the last frame":
        data[last + 30] ^= 0xFF  # the last record's bytes were written whole, and changed since
        assert data[-1] != 0
    elif tail.startswith("flipped"):  # as a finalize of reward 1.0 ends (cb 3f f0 00 .. 00), a byte changed
        n = 7 if (len(data) - 7) % BLOCK else 6
        data[-n:] = bytes(n)
        data[last + 30] ^= 0xFF
    else:
        data[before_last + 30:before_last + n] = bytes(n - 30)
    path.write_bytes(bytes(data))
    with pytest.raises(JournalDamagedError):
        _service(path)
