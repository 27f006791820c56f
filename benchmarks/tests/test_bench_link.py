"""``ShapedLoopback``: the loopback link at a set rate for a curve, refused where it cannot be set or would
replace someone else's qdisc, always taken away again; ``bench scale --link-gbit`` fails before its curves."""

import argparse
import os
import shutil
import subprocess

import pytest

from dressage_bench import _link, scale
from dressage_bench._link import LinkError, ShapedLoopback


class FakeTc:
    def __init__(self, shown: str = "qdisc noqueue 0: root refcnt 2\n", fail: str | None = None) -> None:
        self.shown, self.fail, self.calls = shown, fail, []

    def __call__(self, argv, **kwargs):
        self.calls.append(argv)
        if self.fail and self.fail in argv:
            return subprocess.CompletedProcess(argv, 2, "", "RTNETLINK answers: Operation not permitted\n")
        return subprocess.CompletedProcess(argv, 0, self.shown if argv[2] == "show" else "", "")


@pytest.fixture()
def as_root(monkeypatch):
    monkeypatch.setattr(_link.os, "geteuid", lambda: 0)
    monkeypatch.setattr(_link.shutil, "which", lambda name: f"/usr/sbin/{name}")


def test_the_link_is_shaped_inside_the_block_and_unshaped_after_it_also_after_a_failure(as_root):
    tc = FakeTc()
    link = ShapedLoopback(25, run=tc)
    assert link.burst == 3_125_000  # a millisecond of 25 Gbit/s: the link's rate, never more
    assert ShapedLoopback(1).burst == 256 << 10
    with pytest.raises(ZeroDivisionError):
        with link:
            assert tc.calls[-1] == ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "25gbit",
                                    "burst", "3125000", "latency", "10ms"]
            1 / 0
    assert tc.calls[-1] == ["tc", "qdisc", "del", "dev", "lo", "root"]
    assert link.describe() == {"device": "lo", "rate_gbit": 25.0, "qdisc": "tbf rate 25gbit burst 3125000 latency 10ms"}


def test_a_link_that_cannot_be_shaped_or_is_shaped_by_someone_else_is_refused_and_left_alone(as_root, monkeypatch):
    with pytest.raises(LinkError, match="positive"):
        ShapedLoopback(0)
    foreign = FakeTc("qdisc netem 8001: root refcnt 2 limit 1000 delay 1ms\n")
    with pytest.raises(LinkError, match="already has a root qdisc"):
        with ShapedLoopback(25, run=foreign):
            pass
    assert [argv[2] for argv in foreign.calls] == ["show"]  # nothing added, nothing deleted
    denied = FakeTc(fail="add")
    with pytest.raises(LinkError, match="Operation not permitted"):
        with ShapedLoopback(25, run=denied):
            pass
    assert [argv[2] for argv in denied.calls] == ["show", "add"]  # what failed to be added is not deleted
    monkeypatch.setattr(_link.shutil, "which", lambda name: None)
    with pytest.raises(LinkError, match="iproute2"):
        ShapedLoopback(25, run=FakeTc()).check()
    monkeypatch.setattr(_link.os, "geteuid", lambda: 1000)
    with pytest.raises(LinkError, match="root"):
        ShapedLoopback(25, run=FakeTc()).check()


def test_bench_scale_with_a_link_it_cannot_shape_fails_before_any_curve(monkeypatch):
    monkeypatch.setattr(_link.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(scale, "run_step_curve", lambda *a, **k: pytest.fail("a curve ran"))
    parser = argparse.ArgumentParser()
    scale.register(parser.add_subparsers())
    args = parser.parse_args(["scale", "--quick", "--link-gbit", "25"])
    with pytest.raises(SystemExit, match="--link-gbit: shaping the loopback link takes root"):
        args.func(args)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tc") is None, reason="needs root and tc")
def test_the_real_loopback_is_shaped_and_restored():
    def shown() -> str:
        return subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout

    before = shown()
    if before.split()[1:2] not in (["noqueue"], ["pfifo_fast"], ["fq_codel"]):
        pytest.skip(f"lo has a qdisc of its own: {before.strip()}")
    with ShapedLoopback(100):  # far above what this host moves: nothing else running notices
        assert "tbf" in shown() and "100Gbit" in shown()
    assert shown() == before


def test_the_units_curve_says_how_close_the_floor_runs_to_the_link(monkeypatch):
    class Link:
        rate_gbit = 25.0

        def __init__(self, rate_gbit):
            assert rate_gbit == 25

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def describe(self):
            return {"device": "lo", "rate_gbit": 25.0, "qdisc": "tbf rate 25gbit burst 3125000 latency 10ms"}

    def point(units, steps, rounds, part_shape):
        return {"units": units, "batched": {"tq_vs_tcp": 0.9, "tcp_gbps": 3.0},
                "per_step": {"tq_vs_tcp": 0.6, "tcp_gbps": 2.5}}

    monkeypatch.setattr(scale, "ShapedLoopback", Link)
    monkeypatch.setattr(scale, "_units_point", point)
    curve = scale.run_units_curve([1, 2], 8, 1, link_gbit=25)
    assert [p["batched"]["tcp_vs_link"] for p in curve["points"]] == [pytest.approx(0.96)] * 2
    assert curve["points"][0]["per_step"]["tcp_vs_link"] == pytest.approx(0.8)
    assert curve["link"]["rate_gbit"] == 25.0 and curve["bounds"]["tq_vs_two_tcp_hops"]["worst"] == 0.9
    unshaped = scale.run_units_curve([1], 8, 1)
    assert unshaped["link"] is None and "tcp_vs_link" not in unshaped["points"][0]["batched"]
