"""Fixtures the Proxy's integration tests share."""

from __future__ import annotations

import pytest

from dressage_bench.faults.hostile import HostileEngine


@pytest.fixture(scope="module")
def hostile():
    """An engine that answers in every broken way a test asks it for (``dressage_bench.faults.hostile``)."""
    srv = HostileEngine()
    srv.start_background()
    yield srv
    srv.stop()
