"""The capacity plot's legend names the R3 dtype each path is priced at."""

import pytest

pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the plot extra)")

from matplotlib.figure import Figure  # noqa: E402

from dressage.capacity import SEED_QWEN_BASELINE, CapacityConfig, plot_projection  # noqa: E402
from dressage.capacity.plot import path_labels  # noqa: E402
from dressage.fields.models import get_model  # noqa: E402
from dressage.units import parse_bytes  # noqa: E402


@pytest.fixture
def legends(monkeypatch):
    seen: list[list[str]] = []
    save = Figure.savefig

    def record(fig, *args, **kw):
        seen.extend([t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes if ax.get_legend())
        return save(fig, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", record)
    return seen


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int32"])
def test_both_curves_name_their_dtype(tmp_path, legends, dtype):
    config = CapacityConfig(model=get_model("glm-5.2-744b-a40b"), context_length=256 * 1024, rollout_batch_size=512,
                            n_samples_per_prompt=8, nodes=32, routed_experts_dtype=dtype,
                            host_memory_bytes=parse_bytes("2TB"))
    plot_projection(config, SEED_QWEN_BASELINE, tmp_path / "fig5.png")
    (texts,) = legends
    without, with_tq = texts[0], texts[1]
    assert without.startswith(f"w/o TQ (R3 {dtype}); fits up to batch ")
    assert with_tq.startswith(f"w/ TQ (R3 {dtype}, 32 StorageUnits); fits up to batch ")
    assert path_labels(config) == (f"w/o TQ (R3 {dtype})", f"w/ TQ (R3 {dtype}, 32 StorageUnits)")
