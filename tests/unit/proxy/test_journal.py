"""The Proxy journal: committed StepRecords survive a restart; torn tails and bad records are typed."""

import numpy as np
import pytest

from dressage.errors import ConfigError
from dressage.dataplane import DataPlaneConfig
from dressage.proxy.recording.core import ProxyCore
from dressage.proxy.journal.log import Journal, JournalError
from dressage.rollout import RolloutManager
from dressage.trajectory import build_segments
from dressage.tq import TransferQueue
from test_offload import MODEL, SCRIPT, _drive
from trajgen import sglang_body


def _cfg(tq):
    return DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=tq,
                           routed_experts_dtype="uint8")


@pytest.mark.parametrize("tq_on", [False, True])
def test_restart_replays_committed_steps_and_resumes_sessions(tmp_path, tq_on):
    path = tmp_path / "proxy.journal"
    tq = TransferQueue.start({"deployment": "embedded", "retention_s": None}) if tq_on else None
    client = tq.client() if tq else None
    try:
        core = ProxyCore(_cfg(tq_on), client, journal=Journal(path, fsync="never"))
        done = _drive(core, SCRIPT, group=0)                     # finalized, not consumed
        live = core.create_session({"group_index": 1})
        prompt = np.asarray([1, 2, 3], np.int32)
        d = core.plan(live.session_id, prompt)
        core.ingest(live.session_id, d, sglang_body(prompt, [40, 41], start=0), prompt_ids=prompt)
        gone = _drive(core, SCRIPT, group=2)
        core.forget(gone.session_id)
        before = {sid: build_segments(s) for sid, s in core.sessions.items()}
        core.journal.close()                                      # the process dies here

        rm = RolloutManager()
        restarted = ProxyCore(_cfg(tq_on), client, sink=rm, journal=Journal(path))
        report = restarted.recover(path)
        assert report.active == [live.session_id] and report.finalized == [done.session_id]
        assert gone.session_id not in restarted.sessions
        for sid, segs in before.items():
            after = build_segments(restarted.sessions[sid])
            assert [s.tokens.tolist() for s in after] == [s.tokens.tolist() for s in segs]
            for a, b in zip(after, segs):
                np.testing.assert_array_equal(a.materialize("routed_experts") if not tq_on else a.tokens,
                                              b.materialize("routed_experts") if not tq_on else b.tokens)
                assert [p.value.key for p in a.large["routed_experts"]] == [p.value.key for p in b.large["routed_experts"]] \
                    if tq_on else True
        assert rm.num_ready == len(before[done.session_id])     # finalized sessions delivered again
        # the resumed session continues with TITO where it stopped
        s = restarted.sessions[live.session_id]
        p2 = np.concatenate([s.steps[0].full_ids, [9]]).astype(np.int32)
        d2 = restarted.plan(live.session_id, p2)
        assert d2.kind == "append" and d2.parent_id == 0
        restarted.ingest(live.session_id, d2, sglang_body(p2, [50], start=d2.routed_experts_start), prompt_ids=p2)
        restarted.journal.close()
        again, _ = Journal.replay(path)
        assert len(again[live.session_id].steps) == 2
    finally:
        if tq:
            tq.shutdown()


def test_a_session_finalized_without_steps_replays_finalized(tmp_path):
    """A finalize that ran out of wait on a session's first call ends it with no steps; the journal
    replays that finalize as it was accepted (a plain finalize of an empty session is still refused)."""
    from dressage.errors import SessionStateError

    path = tmp_path / "j"
    core = ProxyCore(_cfg(False), None, journal=Journal(path, fsync="never"))
    empty = core.create_session({"group_index": 3}, session_id="empty")
    with pytest.raises(SessionStateError, match="no steps"):
        core.finalize(empty.session_id, 1.0)
    assert core.journal is not None and core.sessions["empty"].state == "active"
    done = core.finalize("empty", 1.0, metadata={"label": "x"}, allow_empty=True)
    assert (done.segments, done.reward, done.metadata["label"]) == ([], 1.0, "x")
    core.journal.close()

    rm = RolloutManager()
    restarted = ProxyCore(_cfg(False), None, sink=rm, journal=Journal(path))
    report = restarted.recover(path)
    assert report.finalized == ["empty"] and report.active == []
    s = restarted.sessions["empty"]
    assert (s.state, s.reward, len(s.steps), s.metadata["label"]) == ("finalized", 1.0, 0, "x")
    assert [d.segments for d in report.delivered] == [[]]
    restarted.journal.close()


def test_torn_tail_is_dropped_and_reported(tmp_path):
    path = tmp_path / "j"
    core = ProxyCore(_cfg(False), None, journal=Journal(path))
    _drive(core, SCRIPT)
    core.journal.close()
    data = path.read_bytes()
    path.write_bytes(data[:-7])                                   # crash mid-write of the last record
    sessions, report = Journal.replay(path)
    assert report.truncated_tail
    assert len(next(iter(sessions.values())).steps) == len(SCRIPT)   # finalize record was the torn one
    assert report.active and not report.finalized


def test_a_file_that_is_not_a_journal_is_reported_and_refused(tmp_path):
    path = tmp_path / "j"
    path.write_bytes(b"\xc1" * 8)                                 # not the journal's file magic
    sessions, report = Journal.replay(path)
    assert sessions == {} and report.records == 0
    assert report.damage.kind == "not_a_journal" and report.damage.offset == 0
    with pytest.raises(JournalError, match="not a Dressage journal"):
        Journal(path)
    assert path.read_bytes() == b"\xc1" * 8                       # refused, not overwritten
    with pytest.raises(ConfigError, match="journal.fsync"):
        Journal(tmp_path / "k", fsync="sometimes")


def test_journal_write_failure_records_nothing_and_deletes_keys(tmp_path):
    tq = TransferQueue.start({"deployment": "embedded", "retention_s": None})
    try:
        journal = Journal(tmp_path / "j")
        core = ProxyCore(_cfg(True), tq.client(), journal=journal)
        s = core.create_session()
        import os
        os.close(journal._fd)                                     # the disk went away
        prompt = np.asarray([1, 2, 3], np.int32)
        with pytest.raises(JournalError):
            core.ingest(s.session_id, core.plan(s.session_id, prompt), sglang_body(prompt, [4], start=0),
                        prompt_ids=prompt)
        assert len(s.steps) == 0 and tq.total_keys() == 0
    finally:
        tq.shutdown()
