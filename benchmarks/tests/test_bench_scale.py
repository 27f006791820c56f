"""``dressage bench scale --quick``: every point of the Step-size curve, its bounds, the JSON report and the plot."""

import argparse
import json

import pytest

from dressage_bench import scale


def test_quick_run_writes_every_point_its_bounds_and_a_plot(tmp_path):
    pytest.importorskip("matplotlib")
    parser = argparse.ArgumentParser()
    scale.register(parser.add_subparsers())
    report, plot = tmp_path / "scale.json", tmp_path / "scale.png"
    args = parser.parse_args(["scale", "--quick", "--sizes", "64", "256", "--rounds", "1",
                              "--json", str(report), "--plot", str(plot)])
    assert args.func(args) == 0
    curve = json.loads(report.read_text())["curves"]["step_size"]
    got = {(p["layers"], p["dtype"], p["tokens"]) for p in curve["points"]}
    assert got == {(layers, dtype, t) for layers in (40, 78) for dtype in ("int32", "uint8") for t in (64, 256)}
    for p in curve["points"]:
        itemsize = 4 if p["dtype"] == "int32" else 1
        assert p["stored_bytes"] == (p["tokens"] - 1) * p["layers"] * p["topk"] * itemsize
        assert p["body_bytes"] > p["stored_bytes"]
        assert p["proxy_decode_vs_b64"] > 0 and p["restore_vs_memcpy"] > 0
    assert set(curve["bounds"]) == set(scale.BOUNDS)
    for name, b in curve["bounds"].items():
        assert b["limit"] == scale.BOUNDS[name] and b["met"] == (b["worst"] <= b["limit"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_scale_is_a_registered_bench():
    from dressage_bench.cli import BENCHES

    assert "dressage_bench.scale:register" in BENCHES
