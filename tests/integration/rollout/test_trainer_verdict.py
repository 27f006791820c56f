"""``dressage trainer``'s verdict: a read that restored nothing is not OK."""

from dressage.cli import main
from dressage.cli.trainer import verdict


def test_an_empty_read_from_a_running_proxy_is_empty_not_ok(engine, proxy_stack, capsys):
    proxy = proxy_stack(engine.url)
    assert main(["trainer", "--proxy-url", proxy.url, "--timeout", "2"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"dressage trainer: EMPTY: {proxy.url} had no finalized trajectory to hand over")
    assert "OK" not in last


def test_the_verdict_names_each_outcome():
    base = {"samples": 4, "sessions": 2, "tq_keys_left": 0}
    assert verdict(base, "http://p") == ("OK: 4 Samples restored and checked from 2 trajectories", 0)
    assert verdict({**base, "tq_keys_left": 3}, "http://p")[0].startswith("KEYS LEFT: 3 TransferQueue keys")
    assert verdict({**base, "samples": 0, "sessions": 0}, "http://p")[1] == 1


def test_keys_left_that_cannot_be_counted_fail_the_read_naming_the_unit(engine, tq, proxy_stack, monkeypatch, capsys):
    from dressage.errors import StorageUnitUnavailable
    from dressage.tq.client.client import TransferQueueClient
    from group_sessions import record_session

    proxy = proxy_stack(engine.url, tq=tq, routed_experts_dtype="uint8")
    record_session(proxy.url, "s-0", "g0")

    def stalled(self):
        raise StorageUnitUnavailable("StorageUnit unit0 at tcp://127.0.0.1:1 is unavailable (stats: no reply within 2 s)")

    monkeypatch.setattr(TransferQueueClient, "total_keys", stalled)  # the count at the end of the read
    assert main(["trainer", "--proxy-url", proxy.url, "--expect-sessions", "1", "--timeout", "10"]) == 1
    out, err = capsys.readouterr()
    assert "tq_keys_left" in out and "None" in out and "tq_keys_uncounted" in out
    last = err.strip().splitlines()[-1]
    assert last.startswith("dressage trainer: KEYS UNKNOWN: the TransferQueue keys left after 1 Samples from 1 "
                           "trajectories could not be counted: StorageUnit unit0")
    monkeypatch.undo()
    assert tq.total_keys() == 0  # the read restored, acknowledged and released before the count failed
