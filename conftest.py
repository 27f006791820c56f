"""Suite-wide collection rules for the two test trees (tests/, benchmarks/tests/).

`make test` runs the suite on two pytest-xdist workers with ``--dist loadgroup``; every test gets a
group here. A file's tests form one group, so its module- and class-scoped fixtures (engines,
clusters, deployments) are built once, on one worker. Tests that start a local Ray cluster share one
group instead: they run one after another, as two Ray clusters at once on two cores would only slow
both down.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = "ray" if item.get_closest_marker("ray") is not None else item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(group))
