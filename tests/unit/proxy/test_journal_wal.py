"""The journal as a write-ahead log: every corruption class is reported and its intact prefix
recovered, duplicates are skipped, size stays linear in what is live, files are 0600."""

import dataclasses
import json
import os
import stat
import threading

import numpy as np
import pytest

from dressage.cli import main
from dressage.errors import JournalDamagedError
from dressage.proxy.config import DataPlaneConfig
from dressage.proxy.recording.core import ProxyCore
from dressage.proxy.journal import codec
from dressage.proxy.journal.log import Journal, JournalEncodeError
from dressage.proxy.journal.wal import FILE_MAGIC, HEADER, Scan, _crc32c_py, crc32c
from dressage.tq import TransferQueue
from test_offload import MODEL, SCRIPT, _drive
from trajgen import sglang_body


def _cfg(r3=True):
    return DataPlaneConfig(model=MODEL, use_rollout_routing_replay=r3, enable_transfer_queue=False,
                           routed_experts_dtype="uint8")


def _journal_of(path, sessions=3, **kw):
    core = ProxyCore(_cfg(), None, journal=Journal(path, fsync="never", **kw))
    for g in range(sessions):
        _drive(core, SCRIPT, group=g)
    live = core.create_session({"group_index": 99})
    prompt = np.asarray([1, 2, 3], np.int32)
    core.ingest(live.session_id, core.plan(live.session_id, prompt), sglang_body(prompt, [40, 41], start=0),
                prompt_ids=prompt)
    core.journal.close()
    return core


def _frames(path):
    """(offset, length) of every frame."""
    return [(off, HEADER + len(p)) for _, p, off in Scan(path)]


def _state(sessions):
    return {sid: (s.state, s.reward, [(st.step_id, st.parent_id, st.full_ids.tolist(), st.messages, st.tools)
                                      for st in s.steps.values()])
            for sid, s in sessions.items()}


def _prefix_state(path, tmp_path, nbytes):
    """What replaying exactly the first ``nbytes`` of the file gives."""
    cut = tmp_path / "prefix"
    cut.write_bytes(path.read_bytes()[:nbytes])
    sessions, report = Journal.replay(cut)
    assert report.damage is None
    return _state(sessions), report.records


def test_crc32c_matches_the_standard_check_value():
    assert crc32c(b"123456789") == 0xE3069283 == _crc32c_py(b"123456789")
    data = os.urandom(1000)
    assert crc32c(data) == _crc32c_py(data)
    assert crc32c(data[500:], crc32c(data[:500])) == crc32c(data)


def test_intact_journal_replays_to_its_end(tmp_path):
    path = tmp_path / "j"
    core = _journal_of(path)
    sessions, report = Journal.replay(path)
    assert report.damage is None and report.duplicates == 0 and report.intact_bytes == path.stat().st_size
    assert report.records == len(_frames(path)) == 3 * (1 + len(SCRIPT) + 1) + 2
    assert _state(sessions) == _state(core.sessions)
    assert [seq for seq, _, _ in Scan(path)] == list(range(1, report.records + 1))


@pytest.mark.parametrize("kind", ["torn_tail", "flipped_payload", "flipped_header", "truncated_middle"])
def test_every_corruption_is_reported_and_the_intact_prefix_recovered(tmp_path, kind):
    path = tmp_path / "j"
    _journal_of(path)
    frames = _frames(path)
    data = bytearray(path.read_bytes())
    k = len(frames) // 2
    off, n = frames[k]
    if kind == "torn_tail":
        data = data[:-7]
        k, off = len(frames) - 1, frames[-1][0]
    elif kind == "flipped_payload":
        data[off + HEADER + n // 3] ^= 0x40
    elif kind == "flipped_header":
        data[off + 3] ^= 0x01                                   # a length byte
    else:
        data = data[:off + 5] + data[frames[k + 2][0] + 9:]     # a block cut from the middle
    path.write_bytes(bytes(data))
    sessions, report = Journal.replay(path)
    expected_kind = {"torn_tail": "torn_tail", "flipped_payload": "bad_checksum",
                     "flipped_header": "bad_header", "truncated_middle": "bad_header"}[kind]
    d = report.damage
    assert (d.kind, d.offset, d.intact_records, report.records) == (expected_kind, off, k, k)
    assert report.intact_bytes == off and d.dropped_bytes == len(data) - off
    assert report.truncated_tail == (kind == "torn_tail")
    state, records = _prefix_state(path, tmp_path, off)
    assert records == k and _state(sessions) == state


def test_duplicated_record_is_skipped_and_counted(tmp_path):
    path = tmp_path / "j"
    core = _journal_of(path)
    frames = _frames(path)
    data = path.read_bytes()
    off, n = frames[4]
    path.write_bytes(data[:off + n] + data[off:off + n] + data[off + n:])   # record 5 written twice
    sessions, report = Journal.replay(path)
    assert report.duplicates == 1 and report.damage is None and report.records == len(frames)
    assert _state(sessions) == _state(core.sessions)


def test_a_reordered_record_is_a_sequence_gap(tmp_path):
    path = tmp_path / "j"
    _journal_of(path)
    frames = _frames(path)
    data = path.read_bytes()
    (a, na), (b, nb) = frames[3], frames[4]
    path.write_bytes(data[:a] + data[b:b + nb] + data[a:a + na] + data[b + nb:])
    _, report = Journal.replay(path)
    assert report.damage.kind == "sequence_gap" and report.damage.offset == a and report.records == 3


def test_torn_tail_then_new_traffic_then_a_second_crash(tmp_path):
    path = tmp_path / "j"
    _journal_of(path)
    data = path.read_bytes()
    path.write_bytes(data[:-11])                                # first crash mid-write
    first_ok = len(_frames(path))
    core = ProxyCore(_cfg(), None, journal=None)
    report = core.recover(path)
    assert report.damage.kind == "torn_tail" and report.records == first_ok
    core.journal = Journal(path, fsync="never")                 # cuts the torn tail before appending
    assert core.journal.damage_found.kind == "torn_tail" and core.journal.set_aside is None
    assert path.stat().st_size == report.intact_bytes
    extra = _drive(core, SCRIPT, group=7)
    core.journal.close()
    total = len(_frames(path))
    assert total == first_ok + 1 + len(SCRIPT) + 1
    path.write_bytes(path.read_bytes()[:-3])                    # second crash mid-write
    sessions, report2 = Journal.replay(path)
    assert report2.damage.kind == "torn_tail" and report2.records == total - 1
    assert len(sessions[extra.session_id].steps) == len(SCRIPT)  # only the finalize record was torn
    assert sessions[extra.session_id].state == "active"
    assert [seq for seq, _, _ in Scan(path)] == list(range(1, total))


def test_a_record_replay_refuses_ends_the_prefix_and_reopen_sets_the_rest_aside(tmp_path):
    path = tmp_path / "j"
    core = _journal_of(path, sessions=1)
    good = path.stat().st_size
    core.journal = j = Journal(path, fsync="never")
    j.finalized("no-such-session", 1.0)                         # well framed, but names nobody
    j.aborted(next(iter(core.sessions)), "late")
    j.close()
    sessions, report = Journal.replay(path)
    assert report.damage.kind == "bad_record" and report.damage.offset == good
    assert "no-such-session" in report.damage.detail and report.intact_bytes == good
    assert all(s.state != "aborted" for s in sessions.values())  # the record after it is not applied
    j2 = Journal(path, intact_bytes=report.intact_bytes)
    j2.close()
    assert path.stat().st_size == good and j2.set_aside is not None
    assert j2.set_aside.stat().st_size > 0 and stat.S_IMODE(j2.set_aside.stat().st_mode) == 0o600
    assert Journal.replay(path)[1].damage is None


def test_journal_size_is_linear_in_the_tokens_of_a_long_session(tmp_path):
    def run(turns):
        path = tmp_path / f"j{turns}"
        core = ProxyCore(_cfg(r3=False), None, journal=Journal(path, fsync="never"))
        s = core.create_session()
        prompt = np.arange(1, 51, dtype=np.int32)
        msgs = [{"role": "user", "content": "x" * 200}]
        for t in range(turns):
            d = core.plan(s.session_id, prompt)
            resp = np.full(10, 7 + t % 100, np.int32)
            core.ingest(s.session_id, d, sglang_body(prompt, resp, start=0), prompt_ids=prompt,
                        messages=list(msgs), tools=[{"type": "function", "function": {"name": "f"}}])
            msgs += [{"role": "assistant", "content": "y" * 40}, {"role": "user", "content": "z" * 200}]
            prompt = np.concatenate([s.steps[t].full_ids, np.arange(100, 150, dtype=np.int32)])
        core.journal.close()
        sessions, _ = Journal.replay(path)
        assert _state(sessions) == _state(core.sessions)        # the deltas rebuild the same steps
        return path.stat().st_size

    small, large = run(30), run(60)
    # Each turn adds 60 tokens and two messages. Re-journalling the history would grow ~4x for 2x
    # the turns (turn 60 alone would store ~3600 tokens and 120 messages).
    assert large / small < 2.2
    assert (large - small) / 30 < 2000                         # bytes per added turn


def test_compaction_keeps_live_sessions_and_drops_forgotten_ones(tmp_path):
    path = tmp_path / "j"
    core = ProxyCore(_cfg(), None, journal=Journal(path, fsync="never", compact_min_bytes=None))
    done = [_drive(core, SCRIPT, group=g) for g in range(10)]
    for s in done[:8]:
        core.forget(s.session_id)
    before = _state(core.sessions)
    big = path.stat().st_size
    new_size = core.journal.compact()
    assert new_size == path.stat().st_size < big / 3 and core.journal.compactions == 1
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    extra = _drive(core, SCRIPT, group=11)                     # appends go on after the swap
    core.journal.close()
    sessions, report = Journal.replay(path)
    assert report.damage is None
    assert _state(sessions) == {**before, extra.session_id: _state(core.sessions)[extra.session_id]}
    assert [seq for seq, _, _ in Scan(path)] == list(range(1, report.records + 1))


def test_compaction_runs_by_itself_and_loses_no_concurrent_append(tmp_path):
    path = tmp_path / "j"
    core = ProxyCore(_cfg(), None, journal=Journal(path, fsync="never", compact_min_bytes=1, compact_ratio=1.0))
    sizes = []
    for g in range(40):
        s = _drive(core, SCRIPT, group=g)
        if g % 4:
            core.forget(s.session_id)
        sizes.append(path.stat().st_size)
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            s = _drive(core, SCRIPT, group=100)
            core.forget(s.session_id)

    t = threading.Thread(target=writer)
    t.start()
    for _ in range(3):
        core.journal.compact()
    stop.set()
    t.join()
    core.journal.wait_compaction()
    assert core.journal.compaction_error is None and core.journal.compactions >= 4
    expected = _state(core.sessions)
    core.journal.close()
    sessions, report = Journal.replay(path)
    assert report.damage is None and _state(sessions) == expected and len(expected) == 10
    # 10 live sessions: the file stays within a small multiple of them, not of the 40+ written
    live_only = tmp_path / "live"
    j = Journal(live_only, fsync="never", compact_min_bytes=None)
    c2 = ProxyCore(_cfg(), None, journal=j)
    for g in range(10):
        _drive(c2, SCRIPT, group=g)
    j.close()
    assert path.stat().st_size < 3 * live_only.stat().st_size


def test_files_are_private(tmp_path):
    path = tmp_path / "j"
    path.write_bytes(b"")
    os.chmod(path, 0o644)
    Journal(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    fresh = tmp_path / "sub" / "k"
    Journal(fresh).close()
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600 and fresh.read_bytes() == FILE_MAGIC


@pytest.mark.parametrize("bad", ["\ud800", 2**64, {"k": {1, 2}}])
def test_values_the_journal_cannot_store_are_refused_and_nothing_is_recorded(tmp_path, bad):
    tq = TransferQueue.start({"deployment": "embedded", "retention_s": None})
    try:
        path = tmp_path / "j"
        core = ProxyCore(DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=True,
                                         routed_experts_dtype="uint8"), tq.client(),
                         journal=Journal(path, fsync="never"))
        with pytest.raises(JournalEncodeError):
            core.create_session({"note": bad})
        assert core.sessions == {}
        s = core.create_session({"ok": 1})
        prompt = np.asarray([1, 2, 3], np.int32)
        with pytest.raises(JournalEncodeError):
            core.ingest(s.session_id, core.plan(s.session_id, prompt), sglang_body(prompt, [4], start=0),
                        prompt_ids=prompt, metadata={"x": bad})
        assert len(s.steps) == 0 and tq.total_keys() == 0
        core.journal.close()
        sessions, report = Journal.replay(path)
        assert report.records == 1 and report.damage is None and list(sessions) == [s.session_id]
    finally:
        tq.shutdown()


def test_cli_check_and_repair(tmp_path, capsys):
    path = tmp_path / "j"
    _journal_of(path)
    assert main(["proxy", "journal", "check", str(path)]) == 0
    assert "intact" in capsys.readouterr().out
    frames = _frames(path)
    data = bytearray(path.read_bytes())
    off = frames[6][0]
    data[off + HEADER + 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert main(["proxy", "journal", "check", "--json", str(path)]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] is False and rep["records"] == 6 and rep["damage"]["kind"] == "bad_checksum"
    assert rep["damage"]["offset"] == off and rep["frames_after_damage"] == len(frames) - 7
    assert main(["proxy", "journal", "check", str(path)]) == 1
    said = capsys.readouterr().out.splitlines()[-1]
    assert said.startswith("DAMAGED: bad_checksum") and said.endswith(
        f"the first 6 records are intact: `dressage proxy journal repair {path}` keeps them and sets the rest "
        "aside (or start the Proxy with --journal-recover truncate)")
    assert main(["proxy", "journal", "repair", "--json", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["after"]["ok"] and out["after"]["records"] == 6 and path.stat().st_size == off
    aside = tmp_path / f"j.damaged-{off}"
    assert out["set_aside"] == str(aside) and aside.read_bytes() == bytes(data[off:])
    assert main(["proxy", "journal", "check", str(tmp_path / "missing")]) == 2


@pytest.mark.slow
def test_a_journal_past_msgpack_default_buffer_replays(tmp_path):
    """Over 100 MiB in total and one record over 100 MiB: both beyond msgpack's default limits."""
    path = tmp_path / "big"
    core = ProxyCore(_cfg(r3=False), None, journal=Journal(path, fsync="never"))
    s = core.create_session()
    n = 14_000_000                                             # 56 MB ids + 56 MB logprobs in one record
    prompt = np.asarray([1, 2, 3], np.int32)
    resp = np.full(n, 5, np.int32)
    core.begin_step(s.session_id, core.plan(s.session_id, prompt), prompt_ids=prompt, response_ids=resp,
                    logprobs=np.linspace(-1, 0, n, dtype=np.float32)).result()
    core.finalize(s.session_id, 1.0)
    del resp
    core.journal.close()
    assert path.stat().st_size > 100 * 2**20
    sessions, report = Journal.replay(path)
    assert report.damage is None and report.records == 3 and report.finalized == [s.session_id]
    st = sessions[s.session_id].steps[0]
    assert st.response_len == n and float(st.logprobs[-1]) == 0.0 and float(st.logprobs[0]) == -1.0


def test_build_service_appends_where_replay_stopped(tmp_path):
    from dressage.proxy.config import JournalConfig, ProxyConfig, EnginesConfig
    from dressage.proxy.deployment import build_service
    from dressage.tokenizer import load_tokenizer

    path = tmp_path / "j"
    core = _journal_of(path, sessions=1)
    good = path.stat().st_size
    j = Journal(path, fsync="never")
    j.finalized("no-such-session", 1.0)                         # framed well, refused by replay
    j.close()
    cfg = ProxyConfig(data_plane=_cfg(), journal=JournalConfig(path=str(path), fsync="never"),
                      engines=EnginesConfig(engine_url="http://127.0.0.1:9"))
    with pytest.raises(JournalDamagedError, match=f"bad_record at byte {good}"):
        build_service(cfg, tokenizer=load_tokenizer("byte"))  # refused by default, the journal untouched
    assert path.stat().st_size > good
    cfg = dataclasses.replace(cfg, journal=JournalConfig(path=str(path), fsync="never", recover="truncate"))
    service, report = build_service(cfg, tokenizer=load_tokenizer("byte"))
    assert report.intact_bytes == good and path.stat().st_size == good
    live = next(sid for sid, s in service.core.sessions.items() if s.state == "active")
    service.core.finalize(live, 0.5)                            # a new record after the cut
    service.core.journal.close()
    sessions, again = Journal.replay(path)
    assert again.damage is None and sessions[live].state == "finalized" and sessions[live].reward == 0.5
    assert set(sessions) == set(core.sessions)


def _step(core, sid, tokens=(1, 2, 3)):
    prompt = np.asarray(tokens, np.int32)
    core.ingest(sid, core.plan(sid, prompt), sglang_body(prompt, [40, 41], start=0), prompt_ids=prompt)


def test_compaction_of_a_session_id_used_again_keeps_only_its_second_life(tmp_path):
    """A drained header id used again starts a new session: compaction drops every record of the
    first life (read and acknowledged) and the compacted journal replays with the second life active."""
    path = tmp_path / "j"
    core = ProxyCore(_cfg(), None, journal=Journal(path, fsync="never", compact_min_bytes=None))
    core.create_session({"group_index": 0}, session_id="X")
    _step(core, "X")
    core.finalize("X", 1.0)
    core.forget("X")  # read and acknowledged
    other = _drive(core, SCRIPT, group=1)
    core.create_session({"group_index": 2}, session_id="X")  # the second life
    _step(core, "X", (7, 8, 9))
    expected = _state(core.sessions)
    assert expected["X"][0] == "active" and expected["X"][2][0][2] == [7, 8, 9, 40, 41]
    uncompacted, _ = Journal.replay(path)
    assert _state(uncompacted) == expected
    core.journal.compact()
    sessions, report = Journal.replay(path)
    assert report.damage is None and _state(sessions) == expected
    assert sorted(report.active) == ["X"] and report.finalized == [other.session_id]
    assert [codec.split(p)[0] for _, p, _ in Scan(path) if codec.split(p)[1] == "X"] == ["session", "step"]
    core.finalize("X", 0.5)  # the second life goes the way of the first, and so does a compaction after it
    core.forget("X")
    core.journal.compact()
    core.journal.close()
    sessions, report = Journal.replay(path)
    assert report.damage is None and list(sessions) == [other.session_id]


def test_compaction_keeps_aborted_ids_remembered_as_aborted(tmp_path):
    """A replay remembers an aborted id (a late call is told it is aborted): so does the replay of a
    compacted journal, which keeps the session and abort records of an aborted session, not its steps."""
    path = tmp_path / "j"
    core = ProxyCore(_cfg(), None, journal=Journal(path, fsync="never", compact_min_bytes=None))
    for sid in ("A", "D"):
        core.create_session({"group_index": 0}, session_id=sid)
        _step(core, sid)
    core.abort("A")
    core.discard("D")  # an active session discarded: journaled as aborted
    done = _drive(core, SCRIPT, group=3)
    uncompacted, before = Journal.replay(path)
    assert sorted(before.aborted) == ["A", "D"]
    size = path.stat().st_size
    core.journal.compact()
    core.journal.close()
    sessions, report = Journal.replay(path)
    assert report.damage is None and path.stat().st_size < size
    assert sorted(report.aborted) == ["A", "D"] and report.finalized == [done.session_id]
    assert {sid: len(s.steps) for sid, s in sessions.items()} == {"A": 0, "D": 0, done.session_id: len(SCRIPT)}
    sid = done.session_id
    assert _state({sid: sessions[sid]}) == _state({sid: uncompacted[sid]})
    restarted = ProxyCore(_cfg(), None)
    restarted.recover(path)
    assert restarted.state_of("A") == "aborted" and restarted.state_of("D") == "aborted"


def test_an_aborted_id_used_again_replays_as_its_new_life(tmp_path):
    """Aborted ids are remembered in bounded number: one the Proxy stopped remembering may be used again,
    and the journal then replays, compacted or not, with the new session (not "created twice")."""
    path = tmp_path / "j"
    core = ProxyCore(_cfg(), None, journal=Journal(path, fsync="never", compact_min_bytes=None))
    core.create_session({"group_index": 0}, session_id="R")
    _step(core, "R")
    core.gone_capacity = 0  # the Proxy remembers no gone id: "R" may be used again
    core.abort("R")
    core.create_session({"group_index": 1}, session_id="R")
    _step(core, "R", (5, 6, 7))
    expected = _state(core.sessions)
    sessions, report = Journal.replay(path)
    assert report.damage is None and report.active == ["R"] and _state(sessions) == expected
    core.journal.compact()
    core.journal.close()
    sessions, report = Journal.replay(path)
    assert report.damage is None and report.active == ["R"] and _state(sessions) == expected
