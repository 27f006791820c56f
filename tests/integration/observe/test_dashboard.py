"""Every metric the Grafana dashboard (docs/grafana/dressage.json) queries is served: by a Proxy with a
journal over a ``local`` TransferQueue, by its Controller or by its StorageUnit, after a little traffic,
or by a training rank's restore metrics."""

from __future__ import annotations

import json
import pathlib
import re

import httpx
from prometheus_client.parser import text_string_to_metric_families

from dressage.proxy.config import JournalConfig
from dressage.tq import TransferQueue
from dressage.train.metrics import RestoreMetrics

DASHBOARD = pathlib.Path(__file__).resolve().parents[3] / "docs" / "grafana" / "dressage.json"
_NAME = re.compile(r"\bdressage_[a-z0-9_]+")


def _exprs(node) -> list[str]:
    if isinstance(node, dict):
        own = [node["expr"]] if "expr" in node else []
        return own + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def _served(url: str) -> set[str]:
    r = httpx.get(url, timeout=10)
    assert r.status_code == 200, r.text
    names = set()
    for family in text_string_to_metric_families(r.text):
        names.update(s.name for s in family.samples)
        if family.type == "counter":  # declared, nothing counted yet (a labelled counter): its _total exists
            names.add(family.name + "_total")
    return names


def test_every_metric_the_dashboard_uses_exists(engine, proxy_stack, tmp_path):
    exprs = _exprs(json.loads(DASHBOARD.read_text()))
    used = {name for e in exprs for name in _NAME.findall(e)}
    assert len(exprs) >= 30 and len(used) >= 40
    with TransferQueue.start({"deployment": "local", "num_storage_units": 1, "metrics_port": 0,
                              "retention_s": None}) as tq:
        proxy = proxy_stack(engine.url, tq=tq, journal=JournalConfig(path=str(tmp_path / "journal")))
        r = httpx.post(proxy.url + "/v1/chat/completions", timeout=30, headers={"X-Session-Id": "d-1"},
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        served = _served(proxy.url + "/metrics")
        for url in tq.metrics_urls().values():
            served |= _served(url)
    trainer = RestoreMetrics().serve("127.0.0.1", 0)
    try:
        served |= _served(trainer.url)
    finally:
        trainer.close()
    missing = sorted(used - served)
    assert not missing, missing
