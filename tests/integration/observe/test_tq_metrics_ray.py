"""The metrics ports of a ``ray`` TransferQueue: the Controller process and the StorageUnit actor each serve
``/metrics``, with the exact keys and bytes after known puts."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

ray = pytest.importorskip("ray")

from dressage.tq import TransferQueue  # noqa: E402

pytestmark = pytest.mark.ray


def scrape(url: str) -> dict:
    r = httpx.get(url, timeout=10)
    assert r.status_code == 200, r.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def test_ray_controller_and_unit_actor_serve_metrics():
    # address="local": a cluster of this test's own, never one another process on the host started
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=80 * 1024 * 1024)
    try:
        arrays = [np.full((64, 4, 2), i, dtype=np.uint8) for i in range(5)]
        with TransferQueue.start({"deployment": "ray", "unit_memory_budget": "16MiB", "metrics_port": 0,
                                  "retention_s": None}) as tq:
            urls = tq.metrics_urls()
            assert sorted(urls) == ["controller", "unit0"]
            client = tq.client()
            try:
                client.put_many([("routed_experts", a) for a in arrays])
            finally:
                client.close()
            unit = (("unit", "unit0"),)
            m = scrape(urls["unit0"])
            assert m[("dressage_tq_unit_keys", unit)] == 5
            assert m[("dressage_tq_unit_put_bytes_total", unit)] == sum(a.nbytes for a in arrays)
            c = scrape(urls["controller"])
            assert c[("dressage_tq_unit_live", unit)] == 1 and c[("dressage_tq_dead_units", ())] == 0
    finally:
        ray.shutdown()
