"""The memory benchmark's plots name the R3 dtype of both paths (titles of the timeline panels,
legend of the batch-size plot), on a report of known values."""

import pytest

pytest.importorskip("matplotlib", reason="the plots need matplotlib (the plot extra)")

from matplotlib.figure import Figure  # noqa: E402

from dressage_bench.memory.pipeline import METRIC_COMPONENTS  # noqa: E402
from dressage_bench.memory.plot import path_titles, plot_batch_sizes, plot_timeline  # noqa: E402

GIB = 1 << 30


def _timeline(name):
    comps = METRIC_COMPONENTS[name]
    return {"t": [0.0, 1.0, 2.0], "master": [GIB, 2 * GIB, GIB], "marks": [{"t": 0.0, "label": "measure"}],
            "values": {c: [0, GIB // 2, 0] for c in comps}}


def _report(dtype):
    return {
        "routed_experts_dtype": dtype, "config": {"n_samples_per_prompt": 2}, "bench_config": {},
        "timelines": {dtype: {p: _timeline(p) for p in ("without_tq", "with_tq")}},
        "by_dtype": {dtype: {"without_tq": {"master_peak_bytes": 2 * GIB}, "with_tq": {"master_peak_bytes": GIB},
                             "master_peak_ratio": 0.5}},
        "batch_size_projection": {"points": [{"rollout_batch_size": b, "without_tq": b * GIB, "with_tq": b * GIB // 4}
                                             for b in (1, 2, 4)],
                                  "measured": {"rollout_batch_size": 2, "without_tq": 2 * GIB, "with_tq": GIB // 2}},
    }


@pytest.fixture
def figures(monkeypatch):
    seen = []
    save = Figure.savefig

    def record(fig, *args, **kw):
        seen.append({"titles": [ax.get_title() for ax in fig.axes],
                     "legend": [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]})
        return save(fig, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", record)
    return seen


@pytest.mark.parametrize("dtype", ["uint8", "int32"])
def test_plots_name_the_dtype_of_both_paths(tmp_path, figures, dtype):
    assert path_titles(dtype) == (f"w/o TQ (R3 {dtype})", f"w/ TQ (R3 {dtype})")
    report = _report(dtype)
    plot_timeline(report, dtype, tmp_path / "timeline.png")
    plot_batch_sizes(report, tmp_path / "batch.png")
    timeline, batch = figures
    assert timeline["titles"] == [f"w/o TQ (R3 {dtype}): peak M_master 2.00 GiB",
                                  f"w/ TQ (R3 {dtype}): peak M_master 1.00 GiB"]
    assert batch["legend"][:2] == [f"w/o TQ (R3 {dtype})", f"w/ TQ (R3 {dtype})"]
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"
