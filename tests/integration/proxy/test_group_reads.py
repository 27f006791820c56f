"""A batch ``/trajectory/read`` hands over whole prompt groups: a group waits for ``min_group_size``
finalized sessions, or until its oldest finalized session is ``group_timeout_s`` old; the groups held
back are listed in ``meta_info.incomplete_groups``. Over HTTP and through ``ProxyTrajectorySource``."""

from __future__ import annotations

import httpx
import pytest

from dressage.cli import build_parser
from dressage.cli.proxy import proxy_config
from dressage.errors import ConfigError, ProxyStatusError
from dressage.proxy.config import JournalConfig, ReadsConfig
from dressage.proxy.upstream.read import GroupRule, select_trajectories
from dressage.testing.stack import start_proxy
from group_sessions import finalize_session, read_trajectories, record_session
from dressage.train.remote import ProxyTrajectorySource, drain


def _backdate(proxy, sids, seconds: float) -> None:
    """Make the sessions' finalize ``seconds`` older (the group age counts from ``finalized_at``)."""
    for sid in sids:
        proxy.service.trajectories.finalized[sid].finalized_at -= seconds


@pytest.fixture()
def proxy(engine, proxy_stack):
    return proxy_stack(engine.url, min_group_size=4, group_timeout_s=600.0)


def test_drained_batch_read_never_hands_over_a_partial_group(proxy):
    url = proxy.url
    for i in range(3):
        record_session(url, f"g7-{i}", "7")
    record_session(url, "g7-3", "7", finalize=False)
    for i in range(4):
        record_session(url, f"g8-{i}", "8")
    read = read_trajectories(url, drain=True)
    assert [[seg["trajectory_id"] for seg in group] for group in read["data"]] == [[f"g8-{i}" for i in range(4)]]
    assert read["meta_info"]["timed_out_groups"] == []   # a whole group is not flagged
    (held,) = read["meta_info"]["incomplete_groups"]
    assert (held["key"], held["finalized"]) == ("7", 3) and 0 <= held["age_s"] < 600
    again = read_trajectories(url, drain=True)  # still 3 of 4: nothing handed over, the group stays listed
    assert again["data"] == [] and [g["key"] for g in again["meta_info"]["incomplete_groups"]] == ["7"]
    assert sorted(proxy.service.trajectories.finalized) == [f"g7-{i}" for i in range(3)]
    finalize_session(url, "g7-3", "7")
    whole = read_trajectories(url, drain=True)
    assert [sorted(seg["trajectory_id"] for seg in group) for group in whole["data"]] == \
        [[f"g7-{i}" for i in range(4)]]
    assert whole["meta_info"]["incomplete_groups"] == [] and not proxy.service.trajectories.finalized


def test_group_timeout_hands_over_the_partial_group(proxy):
    url = proxy.url
    for i in range(2):
        record_session(url, f"late-{i}", "3")
    assert read_trajectories(url, drain=True, group_timeout_s=100.0)["data"] == []
    _backdate(proxy, ["late-0"], 150.0)  # the oldest session of the group is now 150 s old
    young = read_trajectories(url, drain=True, group_timeout_s=200.0)  # not yet old enough for this read's timeout
    assert young["data"] == [] and young["meta_info"]["incomplete_groups"][0]["age_s"] >= 150.0
    timed_out = read_trajectories(url, drain=True, group_timeout_s=100.0)
    assert [sorted(seg["trajectory_id"] for seg in g) for g in timed_out["data"]] == [["late-0", "late-1"]]
    assert timed_out["meta_info"]["incomplete_groups"] == []
    assert timed_out["meta_info"]["timed_out_groups"] == ["3"]   # flagged: handed over short of min_group_size
    assert read_trajectories(url, drain=True)["meta_info"]["incomplete_groups"] == []


def test_a_read_may_lower_the_group_size_and_named_reads_ignore_it(proxy):
    url = proxy.url
    for i in range(2):
        record_session(url, f"two-{i}", "5")
    named = read_trajectories(url, session_id="two-0")  # named trajectories are read as named
    assert [seg["trajectory_id"] for seg in named["data"]] == ["two-0"]
    assert read_trajectories(url)["data"] == []
    smaller = read_trajectories(url, min_group_size=2, drain=True)
    assert [sorted(seg["trajectory_id"] for seg in g) for g in smaller["data"]] == [["two-0", "two-1"]]


@pytest.mark.parametrize("body, field", [
    ({"min_group_size": 0}, "min_group_size"), ({"min_group_size": -3}, "min_group_size"),
    ({"min_group_size": "4"}, "min_group_size"), ({"min_group_size": 2.5}, "min_group_size"),
    ({"group_timeout_s": 0}, "group_timeout_s"), ({"group_timeout_s": -1.0}, "group_timeout_s"),
    ({"group_timeout_s": "soon"}, "group_timeout_s")])
def test_bad_group_settings_are_a_400_naming_the_field(proxy, body, field):
    record_session(proxy.url, "kept", "1")
    r = httpx.post(proxy.url + "/trajectory/read", json={**body, "drain": True}, timeout=10)
    assert r.status_code == 400 and field in r.text
    assert list(proxy.service.trajectories.finalized) == ["kept"]  # nothing read, nothing drained


def test_trajectory_source_passes_the_group_settings(proxy):
    url = proxy.url
    for i in range(3):
        record_session(url, f"s-{i}", "2")
    record_session(url, "s-3", "2", finalize=False)
    source = ProxyTrajectorySource(url)
    batch = source.read(drain=True)
    assert batch.samples == [] and batch.trajectories == 0
    assert [(g["key"], g["finalized"]) for g in batch.meta_info["incomplete_groups"]] == [("2", 3)]
    assert list(drain(source)) == []  # drain stops at the first empty read; the group stays
    assert sorted(proxy.service.trajectories.finalized) == ["s-0", "s-1", "s-2"]
    _backdate(proxy, ["s-0"], 50.0)
    (batch,) = list(drain(source, group_timeout_s=10.0))
    assert sorted({s.session_id for s in batch.samples}) == ["s-0", "s-1", "s-2"]
    assert batch.meta_info["incomplete_groups"] == []
    finalize_session(url, "s-3", "2")
    assert source.read(drain=False, min_group_size=2).trajectories == 0  # a group of one is short of 2
    assert {s.session_id for s in source.read(drain=True, min_group_size=1).samples} == {"s-3"}
    with pytest.raises(ProxyStatusError) as err:
        source.read(min_group_size=0)
    assert err.value.status_code == 400 and "min_group_size" in str(err.value)


def test_group_rule_and_config_reject_bad_values_and_flags_set_them():
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ConfigError, match="min_group_size"):
            GroupRule(bad, 1.0)
        with pytest.raises(ConfigError, match="reads.min_group_size"):
            ReadsConfig(min_group_size=bad)
    for bad in (0, -1.0, True, "3"):
        with pytest.raises(ConfigError, match="group_timeout_s"):
            GroupRule(2, bad)
        with pytest.raises(ConfigError, match="reads.group_timeout_s"):
            ReadsConfig(group_timeout_s=bad)
    args = build_parser().parse_args(["proxy", "serve", "--engine-url", "http://e:2", "--min-group-size", "8",
                                      "--group-timeout", "45"])
    cfg = proxy_config(args)
    assert (cfg.reads.min_group_size, cfg.reads.group_timeout_s) == (8, 45.0)
    assert (proxy_config(build_parser().parse_args(["proxy", "serve", "--engine-url", "http://e:2"])).reads
            == ReadsConfig(min_group_size=1, group_timeout_s=300.0))


class _Done:
    def __init__(self, sid: str, instance: str | None, at: float) -> None:
        self.session_id, self.finalized_at = sid, at
        self.metadata = {} if instance is None else {"instance_id": instance}


def test_selection_keeps_group_order_counts_ages_and_caps_ready_groups():
    finalized = {d.session_id: d for d in [_Done("a0", "A", 10.0), _Done("b0", "B", 11.0), _Done("a1", "A", 12.0),
                                           _Done("c0", "C", 13.0), _Done("b1", "B", 14.0), _Done("solo", None, 15.0)]}
    sel = select_trajectories(finalized, groups_rule=GroupRule(2, 30.0), now=20.0)
    assert sel.groups == [["a0", "a1"], ["b0", "b1"]]
    assert sel.incomplete == [{"key": "C", "finalized": 1, "age_s": 7.0},
                              {"key": "session:solo", "finalized": 1, "age_s": 5.0}]
    later = select_trajectories(finalized, groups_rule=GroupRule(2, 30.0), now=43.0)
    assert later.groups == [["a0", "a1"], ["b0", "b1"], ["c0"]]  # C timed out (30 s); solo is 28 s old
    assert later.incomplete == [{"key": "session:solo", "finalized": 1, "age_s": 28.0}]
    capped = select_trajectories(finalized, groups_rule=GroupRule(2, 30.0), now=43.0, max_groups=1)
    assert capped.groups == [["a0", "a1"]] and capped.incomplete == later.incomplete
    assert select_trajectories(finalized, now=20.0).groups == [["a0", "a1"], ["b0", "b1"], ["c0"], ["solo"]]


def test_a_partial_group_held_back_before_a_restart_is_still_held_after_the_journal_replay(engine, tmp_path):
    journal = JournalConfig(path=str(tmp_path / "proxy.journal"), fsync="never")
    with start_proxy(engine.url, journal=journal, min_group_size=3, group_timeout_s=600.0) as proxy:
        for i in range(2):
            record_session(proxy.url, f"r-{i}", "9")
        _backdate(proxy, ["r-0"], 500.0)  # close to timing out before the restart
        assert read_trajectories(proxy.url)["meta_info"]["incomplete_groups"][0]["age_s"] >= 500.0
    with start_proxy(engine.url, journal=journal, min_group_size=3, group_timeout_s=600.0) as proxy:
        # The replay hands the finalized sessions over again: their age counts from the replay, so
        # the group's late peers get a whole timeout after a restart, and nothing is handed over early.
        read = read_trajectories(proxy.url, drain=True)
        (held,) = read["meta_info"]["incomplete_groups"]
        assert read["data"] == [] and (held["key"], held["finalized"]) == ("9", 2) and held["age_s"] < 500.0
        record_session(proxy.url, "r-2", "9")
        whole = read_trajectories(proxy.url, drain=True)
        assert [sorted(seg["trajectory_id"] for seg in g) for g in whole["data"]] == [["r-0", "r-1", "r-2"]]
