"""The transformers backend's tiny MoE scores a 32K-token prompt in a bounded resident set.

Eager float64 attention held a ``[heads, T, T]`` score matrix (and its softmax): a 17K-token prompt
grew the engine to 21 GB. The measurement is ``benchmarks/moe_long_prompt.py``'s (a child process,
its resident set sampled with psutil).
"""

import importlib.util
import pathlib

import pytest

pytest.importorskip("torch", reason="the transformers backend needs torch (the hf extra)")
pytest.importorskip("transformers", reason="the transformers backend needs transformers (the hf extra)")
pytest.importorskip("psutil")

BENCH = pathlib.Path(__file__).resolve().parents[3] / "benchmarks" / "moe_long_prompt.py"


def _bench():
    spec = importlib.util.spec_from_file_location("moe_long_prompt", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_32k_token_prompt_is_scored_within_two_gib():
    result = _bench().measure(32768, 16)       # checks every position got its routed row
    assert result["peak_rss_mib"] < 2048, result
