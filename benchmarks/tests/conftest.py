"""Tests of the dressage-bench package. Those that go through the ``dressage`` command need the package
installed, since ``dressage bench`` is its entry point (``make test`` installs it)."""

from __future__ import annotations

import pytest

from dressage.cli import plugin_commands

BENCH_INSTALLED = any(ep.name == "bench" and ep.value.startswith("dressage_bench.") for ep in plugin_commands())


@pytest.fixture(scope="session")
def bench_command() -> None:
    if not BENCH_INSTALLED:
        pytest.skip("dressage-bench is not installed (pip install -e benchmarks): `dressage bench` has no entry point")
