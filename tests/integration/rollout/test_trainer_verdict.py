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
