"""Every reader of a Proxy releases the TransferQueue keys of exactly the sessions its ack covered, as soon as
it covered them: a session a named read took over stays that reader's (keys and all), a read whose ack failed
leaves its keys for the next reader, and a draining read the client cannot use forgets nothing."""

from __future__ import annotations

import time

import pytest

from dressage.errors import ProxyConnectionError, ProxyStatusError, SampleWireError
from dressage.export.sources import reading_proxy
from dressage.train import TrainingReader, release_batch
from dressage.train import remote
from dressage.train.ray_actors import RolloutManagerActor
from dressage.train.remote import ProxyTrajectorySource, consume
from group_sessions import record_session

ENGINE = {"seed": 11, "mean_response_tokens": 8, "tool_call_rate": 0.0}


@pytest.fixture
def proxy(engine, tq, proxy_stack):
    """A Proxy over the embedded TQ with four finalized sessions in two prompt groups of two."""
    stack = proxy_stack(engine.url, tq=tq, routed_experts_dtype="uint8", min_group_size=2)
    for i in range(4):
        record_session(stack.url, f"s-{i}", f"g{i // 2}")
    return stack


def _keys(proxy, *sids: str) -> int:
    """How many TQ keys these sessions' steps hold."""
    return sum(len(proxy.service.core.session(sid).large_field_refs()) for sid in sids)


def _take_over_on_ack(monkeypatch, source: ProxyTrajectorySource, named: ProxyTrajectorySource,
                      sid: str) -> list:
    """The first ack of ``source`` is preceded by a named read (leased, as slime's rollout function reads)
    of ``sid`` through ``named``; the list gets that read's batch."""
    real, taken = source.ack, []

    def ack(batch):
        if not taken:
            taken.append(named.read(session_ids=[sid], lease=True))
        return real(batch)

    monkeypatch.setattr(source, "ack", ack)
    return taken


def _train_and_release(reader: ProxyTrajectorySource, batch) -> None:
    """What the named read's owner does: restore, acknowledge, release the keys it acknowledged."""
    TrainingReader(reader.client()).restore(batch.samples)
    reader.ack(batch)
    release_batch(reader.client(), batch.acknowledged_keys())


def test_export_drain_leaves_the_keys_of_a_session_a_named_read_took_over(proxy, tq, monkeypatch):
    total, trainer = tq.total_keys(), ProxyTrajectorySource(proxy.url)
    taken_keys = _keys(proxy, "s-1")
    real_read = ProxyTrajectorySource.read

    def read_then_take_over(self, **kw):  # the trainer's named read lands while the export writes
        batch = real_read(self, **kw)
        taken.append(real_read(trainer, session_ids=["s-1"], lease=True))
        return batch

    taken: list = []
    monkeypatch.setattr(ProxyTrajectorySource, "read", read_then_take_over)
    with reading_proxy(proxy.url, drain=True) as exported:
        assert sorted(e.session_id for e in exported) == ["s-0", "s-1", "s-2", "s-3"]
    monkeypatch.undo()
    assert total > taken_keys > 0 and tq.total_keys() == taken_keys  # the export released only its own
    assert sorted(proxy.service.trajectories.finalized) == ["s-1"]
    _train_and_release(trainer, taken[0])  # the trainer's restore finds every key of its session
    assert tq.total_keys() == 0 and proxy.service.trajectories.finalized == {}


def test_consume_leaves_the_keys_of_a_session_a_named_read_took_over(proxy, tq, monkeypatch):
    source, trainer = ProxyTrajectorySource(proxy.url), ProxyTrajectorySource(proxy.url)
    taken = _take_over_on_ack(monkeypatch, source, trainer, "s-2")
    theirs, ours = _keys(proxy, "s-2"), _keys(proxy, "s-0", "s-1", "s-3")
    report = consume(source, expect_sessions=4, timeout_s=10)
    assert report["acknowledged"] == 3 and report["tq_keys_released"] == ours
    assert tq.total_keys() == theirs > 0
    _train_and_release(trainer, taken[0])
    assert tq.total_keys() == 0 and proxy.service.trajectories.finalized == {}


def test_consume_releases_each_read_keys_once_its_own_ack_went_through(proxy, tq, monkeypatch):
    source = ProxyTrajectorySource(proxy.url)
    real_read, real_ack, acks = source.read, source.ack, []

    def one_group_a_read(**kw):  # as a Proxy whose groups arrive over time answers
        return real_read(max_groups=1, **kw)

    def second_ack_expired(batch):
        acks.append(batch)
        if len(acks) == 2:
            raise ProxyStatusError("HTTP 409: read is expired", status_code=409)
        return real_ack(batch)

    monkeypatch.setattr(source, "read", one_group_a_read)
    monkeypatch.setattr(source, "ack", second_ack_expired)
    with pytest.raises(ProxyStatusError):
        consume(source, expect_sessions=4, timeout_s=10)
    assert sorted(proxy.service.trajectories.finalized) == ["s-2", "s-3"]  # the second group stays
    assert tq.total_keys() == _keys(proxy, "s-2", "s-3")  # the first group's keys went with its ack
    assert len(proxy.service.trajectories.leases) == 0  # the failed read was released at once
    monkeypatch.undo()
    assert consume(source, expect_sessions=2, timeout_s=10)["acknowledged"] == 2
    assert tq.total_keys() == 0 and proxy.service.trajectories.finalized == {}


def test_a_release_after_an_ack_whose_answer_was_lost_releases_the_acknowledged_keys(proxy, tq, monkeypatch):
    source = ProxyTrajectorySource(proxy.url)
    real_ack = source.ack

    def ack_then_connection_lost(batch):
        real_ack(batch)  # the Proxy forgot the read ...
        raise ProxyConnectionError(f"{proxy.url}/trajectory/ack: connection reset")  # ... the answer is lost

    monkeypatch.setattr(source, "ack", ack_then_connection_lost)
    with pytest.raises(ProxyConnectionError):
        consume(source, expect_sessions=4, timeout_s=10)
    # The read is gone from the Proxy; the release learns so and takes its keys along: none is left ownerless.
    assert proxy.service.trajectories.finalized == {} and tq.total_keys() == 0


def test_a_draining_read_the_client_cannot_decode_forgets_nothing(proxy, tq, monkeypatch):
    total = tq.total_keys()

    def undecodable(answer):
        raise SampleWireError("group_index must be an integer, got 'zzz'")

    with monkeypatch.context() as m:
        m.setattr(remote, "_samples_of", undecodable)
        with pytest.raises(SampleWireError):
            ProxyTrajectorySource(proxy.url).read(drain=True)
    assert sorted(proxy.service.trajectories.finalized) == ["s-0", "s-1", "s-2", "s-3"]
    assert len(proxy.service.trajectories.leases) == 0 and tq.total_keys() == total
    batch = ProxyTrajectorySource(proxy.url).read(drain=True)  # readable again at once
    assert sorted(batch.acknowledged) == ["s-0", "s-1", "s-2", "s-3"] and batch.trajectories == 4
    assert proxy.service.trajectories.finalized == {}


def test_a_draining_read_whose_answer_never_arrived_forgets_nothing(proxy, tq, monkeypatch):
    total, source = tq.total_keys(), ProxyTrajectorySource(proxy.url, timeout_s=10)
    real_post = source._post

    def answer_lost(path, body):
        answer = real_post(path, body)  # written in full by the Proxy ...
        if path == "/trajectory/read":
            raise ProxyConnectionError(f"{proxy.url}{path}: connection reset")  # ... never read by the client
        return answer

    monkeypatch.setattr(source, "_post", answer_lost)
    with pytest.raises(ProxyConnectionError):
        source.read(drain=True)
    monkeypatch.undo()
    assert sorted(proxy.service.trajectories.finalized) == ["s-0", "s-1", "s-2", "s-3"]
    assert tq.total_keys() == total
    leases = proxy.service.trajectories.leases
    leases.clock = lambda: time.monotonic() + 3600.0  # the lease runs out: readable again, nothing was lost
    batch = source.read(drain=True)
    assert batch.trajectories == 4
    release_batch(source.client(), batch.acknowledged_keys())
    assert tq.total_keys() == 0 and proxy.service.trajectories.finalized == {}


def test_a_session_a_named_read_took_and_gave_back_is_queued_by_the_later_read_that_acknowledged_it(
        engine, tq, proxy_stack, monkeypatch):
    proxy = proxy_stack(engine.url, tq=tq, routed_experts_dtype="uint8")  # no group waits for a member
    for i in range(4):
        record_session(proxy.url, f"s-{i}", f"g{i}")
    trainer = ProxyTrajectorySource(proxy.url)
    real_ack = ProxyTrajectorySource.ack
    taken = []

    def ack(self, batch):
        if self is not trainer and not taken:  # taken during the first read's restore, then given back
            taken.append(trainer.read(session_ids=["s-0"], lease=True))
            trainer.release(taken[0])
        return real_ack(self, batch)

    monkeypatch.setattr(ProxyTrajectorySource, "ack", ack)
    manager = RolloutManagerActor(dp_size=1)
    assert manager.read_proxy(proxy.url, max_groups=1) == 4  # s-0 acknowledged by a later read of the drain
    monkeypatch.undo()
    batch = manager.rm.take_batch(0)
    assert sorted({s.session_id for s in batch.samples}) == ["s-0", "s-1", "s-2", "s-3"]
    from dressage.rollout.manager import sample_ref_keys

    keys = sorted(sample_ref_keys(batch.samples))
    assert len(keys) == tq.total_keys() == 8
    TrainingReader(tq.client()).restore(batch.samples)
    release_batch(tq.client(), keys)
    assert tq.total_keys() == 0 and proxy.service.trajectories.finalized == {}


def test_an_ack_whose_answer_was_lost_is_sent_again_and_the_drain_keeps_what_it_acknowledged(proxy, tq,
                                                                                              monkeypatch):
    from dressage.rollout.manager import sample_ref_keys

    monkeypatch.setattr(remote, "_ACK_RETRY_S", (0.01, 0.01))
    real_call, lost = ProxyTrajectorySource._call, []

    def call(self, method, path, data):
        answer = real_call(self, method, path, data)  # the Proxy applied it ...
        if path == "/trajectory/ack" and not lost:
            lost.append(answer)
            raise ProxyConnectionError(f"{self.url}{path}: connection reset")  # ... and the answer was lost
        return answer

    monkeypatch.setattr(ProxyTrajectorySource, "_call", call)
    manager = RolloutManagerActor(dp_size=1)
    assert manager.read_proxy(proxy.url) == 4 and lost[0]["acknowledged"] == 2  # a group a read
    monkeypatch.undo()
    batch = manager.rm.take_batch(0)
    assert sorted({s.session_id for s in batch.samples}) == ["s-0", "s-1", "s-2", "s-3"]
    keys = sorted(sample_ref_keys(batch.samples))
    assert len(keys) == tq.total_keys() > 0 and proxy.service.trajectories.finalized == {}
    TrainingReader(tq.client()).restore(batch.samples)
    release_batch(tq.client(), keys)
    assert tq.total_keys() == 0


def test_a_rollout_manager_drain_withdraws_a_session_a_named_read_took_over(proxy, tq, monkeypatch):
    trainer, taken = ProxyTrajectorySource(proxy.url), []
    real_ack = ProxyTrajectorySource.ack

    def ack(self, batch):
        if self is not trainer and not taken:
            taken.append(trainer.read(session_ids=["s-0"], lease=True))
        return real_ack(self, batch)

    monkeypatch.setattr(ProxyTrajectorySource, "ack", ack)
    theirs = _keys(proxy, "s-0")
    manager = RolloutManagerActor(dp_size=1)
    assert manager.read_proxy(proxy.url, max_groups=1) == 3
    monkeypatch.undo()
    batch = manager.rm.take_batch(0)
    assert sorted({s.session_id for s in batch.samples}) == ["s-1", "s-2", "s-3"]
    from dressage.rollout.manager import sample_ref_keys

    keys = sample_ref_keys(batch.samples)
    TrainingReader(tq.client()).restore(batch.samples)
    release_batch(tq.client(), sorted(keys))  # the manager's trainer, after its step
    assert tq.total_keys() == theirs > 0
    _train_and_release(trainer, taken[0])
    assert tq.total_keys() == 0 and proxy.service.trajectories.finalized == {}
