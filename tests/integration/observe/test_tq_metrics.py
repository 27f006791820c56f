"""The metrics ports of a ``local`` TransferQueue's Controller and StorageUnit processes, parsed with
prometheus_client's parser after known puts and reads: exact keys, bytes, puts and reads."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from dressage.errors import ConfigError
from dressage.tq import TransferQueue
from dressage.tq.config import TransferQueueConfig
from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = httpx.get(url, timeout=10)
    assert r.status_code == 200, r.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def test_controller_and_unit_processes_serve_exact_counts(tmp_path):
    arrays = [np.arange(n, dtype=np.int32) for n in (10, 200, 3000)]
    with TransferQueue.start({"deployment": "local", "num_storage_units": 1, "metrics_port": 0,
                              "retention_s": None, "spill_dir": str(tmp_path)}) as tq:
        urls = tq.metrics_urls()
        assert sorted(urls) == ["controller", "unit0"]
        unit = (("unit", "unit0"),)
        empty = scrape(urls["unit0"])
        assert empty[("dressage_tq_unit_keys", unit)] == 0
        client = tq.client()
        try:
            refs = client.put_many([("logprobs", a) for a in arrays])
            client.get_many(refs[:2])
        finally:
            client.close()  # its owed commits reach the Controller
        m = scrape(urls["unit0"])
        total = sum(a.nbytes for a in arrays)
        assert m[("dressage_tq_unit_keys", unit)] == 3
        assert m[("dressage_tq_unit_bytes", unit)] == total
        assert m[("dressage_tq_unit_puts_total", unit)] == 3
        assert m[("dressage_tq_unit_put_bytes_total", unit)] == total
        assert m[("dressage_tq_unit_get_bytes_total", unit)] == arrays[0].nbytes + arrays[1].nbytes
        assert m[("dressage_tq_unit_budget_bytes", unit)] == tq.config.budget_bytes
        deadline = time.monotonic() + 10
        while True:  # a one-way commit may still be on its way
            c = scrape(urls["controller"])
            if c[("dressage_tq_pending_keys", unit)] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert c[("dressage_tq_directory_keys", unit)] == 3
        assert c[("dressage_tq_directory_bytes", unit)] == total
        assert c[("dressage_tq_pending_keys", unit)] == 0
        assert c[("dressage_tq_unit_live", unit)] == 1
        assert c[("dressage_tq_dead_units", ())] == 0


def test_metrics_are_off_by_default_and_the_port_is_checked():
    assert TransferQueueConfig().metrics_port is None
    with pytest.raises(ConfigError, match="metrics_port"):
        TransferQueueConfig(metrics_port=70000)
    with pytest.raises(ConfigError, match="log_format"):
        TransferQueueConfig(log_format="xml")
