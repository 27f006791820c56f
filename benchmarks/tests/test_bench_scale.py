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
    args = parser.parse_args(["scale", "--quick", "--sizes", "64", "256", "--rounds", "3", "--units", "1", "2",
                              "--unit-steps", "3", "--json", str(report), "--plot", str(plot)])
    assert args.func(args) == 0
    curves = json.loads(report.read_text())["curves"]
    curve = curves["step_size"]
    got = {(p["layers"], p["dtype"], p["tokens"]) for p in curve["points"]}
    assert got == {(layers, dtype, t) for layers in (40, 78) for dtype in ("int32", "uint8") for t in (64, 256)}
    for p in curve["points"]:
        itemsize = 4 if p["dtype"] == "int32" else 1
        assert p["stored_bytes"] == (p["tokens"] - 1) * p["layers"] * p["topk"] * itemsize
        assert p["body_bytes"] > p["stored_bytes"]
        assert p["proxy_decode_vs_b64"] > 0 and p["restore_vs_memcpy"] > 0
        # Each figure is the median of its rounds, the best beside it; the judged ratio is of the medians.
        for name in ("b64_decode", "proxy_decode", "memcpy", "restore"):
            assert 0 < p[f"{name}_best_s"] <= p[f"{name}_s"]
        assert p["restore_vs_memcpy"] == pytest.approx(p["restore_s"] / p["memcpy_s"])
        assert p["restore_vs_memcpy_best"] == pytest.approx(p["restore_best_s"] / p["memcpy_best_s"])
    assert set(curve["bounds"]) == set(scale.BOUNDS)
    for name, b in curve["bounds"].items():
        assert b["limit"] == scale.BOUNDS[name] and b["met"] == (b["worst"] <= b["limit"])
    units = curves["storage_units"]
    assert [p["units"] for p in units["points"]] == [1, 2]
    for p in units["points"]:
        assert p["steps"] == 3 and p["step_bytes"] == 4096 * 40 * 8 and 1 <= p["units_written"] <= p["units"]
        assert p["tq_vs_tcp"] == pytest.approx(p["tcp_two_hops_s"] / p["tq_s"])
        assert 0 < p["tq_best_s"] <= p["tq_s"] and 0 < p["tcp_best_s"] <= p["tcp_two_hops_s"]
        assert p["tq_vs_tcp_best"] == pytest.approx(p["tcp_best_s"] / p["tq_best_s"])
        assert p["tq_unauthenticated_vs_tcp"] == pytest.approx(p["tcp_two_hops_s"] / p["tq_unauthenticated_s"])
    b = units["bounds"]["tq_vs_two_tcp_hops"]
    assert b["met"] == (b["worst"] >= b["limit"] == 0.8)
    for path in (plot, tmp_path / "scale-units.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_scale_is_a_registered_bench():
    from dressage_bench.cli import BENCHES

    assert "dressage_bench.scale:register" in BENCHES
