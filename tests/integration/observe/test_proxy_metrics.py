"""``GET /metrics`` of a Proxy, parsed with prometheus_client's own parser after known traffic: the
exact calls, failed calls by status and code, tokens, field bytes and, with an embedded TransferQueue,
the keys and bytes its unit holds; the admin token guards the endpoint."""

from __future__ import annotations

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from dressage.tq import TransferQueue


def scrape(url: str, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = httpx.get(url + "/metrics", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _chat(url: str, sid: str, text: str) -> dict:
    r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": text}],
                                                       "max_tokens": 6},
                   headers={"X-Session-Id": sid}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_metrics_count_the_calls_tokens_failures_and_tq_bytes_of_known_traffic(engine, proxy_stack):
    tq = TransferQueue.start({"deployment": "embedded", "num_storage_units": 1, "retention_s": None})
    try:
        proxy = proxy_stack(engine.url, tq=tq, routed_experts_dtype="uint8")
        before = scrape(proxy.url)
        assert before[("dressage_calls_total", ())] == 0
        assert before[("dressage_sessions", (("state", "active"),))] == 0
        for sid in ("m-a", "m-b"):
            _chat(proxy.url, sid, f"hello {sid}")
        _chat(proxy.url, "m-a", "and again")
        # Two failures: a session that does not exist, and a call on a finalized session.
        assert httpx.post(proxy.url + "/sessions/nope/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": "x"}]}, timeout=10).status_code == 404
        r = httpx.post(proxy.url + "/session/finalize", json={"session_id": "m-b", "reward": 1.0}, timeout=30)
        assert r.status_code == 200, r.text
        late = httpx.post(proxy.url + "/sessions/m-b/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": "x"}]}, timeout=10)
        assert 400 <= late.status_code < 500 and late.status_code != 404, late.text

        m = scrape(proxy.url)
        steps = [st for s in proxy.core.sessions.values() for st in s.steps.values()]
        assert m[("dressage_calls_total", ())] == 3
        assert m[("dressage_steps", ())] == len(steps) == 3
        assert m[("dressage_sessions", (("state", "active"),))] == 1
        assert m[("dressage_sessions", (("state", "finalized"),))] == 1
        assert m[("dressage_generated_tokens_total", ())] == sum(st.response_len for st in steps)
        failed = {k[1]: v for k, v in m.items() if k[0] == "dressage_failed_calls_total"}
        assert sum(failed.values()) == 2 == proxy.service.book.failed_calls
        assert {dict(labels)["status"] for labels in failed} == {"404", str(late.status_code)}
        assert all(v == 1 for v in failed.values()), failed
        # Refusals no call made are errors answered too: a schema's 422, a body over the limit, bad JSON.
        url = proxy.url + "/sessions/m-a/v1/chat/completions"
        assert httpx.post(url, json={"messages": [{"role": "user", "content": "x"}], "n": 65}).status_code == 422
        assert httpx.post(url, content=b"{not json", headers={"content-type": "application/json"}).status_code == 400
        assert httpx.post(url, content=b"x" * (proxy.service.config.server.max_body_bytes + 1),
                          headers={"content-type": "application/json"}).status_code == 413
        failed = {dict(k[1])["status"]: v for k, v in scrape(proxy.url).items()
                  if k[0] == "dressage_failed_calls_total" and dict(k[1])["status"] in ("400", "413", "422")}
        assert failed == {"400": 1, "413": 1, "422": 1} and proxy.service.book.failed_calls == 5
        done = proxy.service.trajectories.finalized["m-b"]
        assert m[("dressage_unread_segments", ())] == len(done.segments) >= 1
        trained = sum(int(np.count_nonzero(seg.loss_mask)) for seg in done.segments)
        assert m[("dressage_trained_tokens_total", ())] == trained == m[("dressage_unread_trained_tokens", ())]
        # Large fields: what the engine answered, all of it offloaded, and what the unit holds.
        r3 = sum(st.routed_experts.nbytes for st in steps if hasattr(st.routed_experts, "nbytes")) or None
        field_bytes = {dict(k[1])["field"]: (dict(k[1])["offloaded"], v) for k, v in m.items()
                       if k[0] == "dressage_field_bytes_total"}
        assert field_bytes["routed_experts"][0] == "true" and field_bytes["logprobs"][0] == "true"
        assert field_bytes["routed_experts"][1] > 0 and (r3 is None or field_bytes["routed_experts"][1] == r3)
        unit = (("unit", "unit0"),)
        stats = tq.stats()["unit0"]
        assert m[("dressage_tq_unit_keys", unit)] == stats["keys"] > 0
        assert m[("dressage_tq_unit_bytes", unit)] == stats["bytes"]
        assert m[("dressage_tq_client_put_bytes_total", ())] == stats["bytes_written"] \
            == m[("dressage_tq_unit_put_bytes_total", unit)]
        assert m[("dressage_tq_client_puts_total", ())] == stats["puts"]
        # One observation per model call in each histogram; the Proxy's share is within the whole.
        assert m[("dressage_call_seconds_count", ())] == 3
        assert m[("dressage_engine_wait_seconds_count", ())] == 3
        assert m[("dressage_proxy_seconds_sum", ())] <= m[("dressage_call_seconds_sum", ())]
        assert m[("dressage_engine_wait_seconds_sum", ())] > 0
        # Each recorded step's TQ write and commit, behind its answer.
        assert m[("dressage_tq_write_seconds_count", ())] == 3 == m[("dressage_commit_seconds_count", ())]
    finally:
        tq.shutdown()


def test_metrics_follow_the_admin_token(engine, proxy_stack):
    proxy = proxy_stack(engine.url, api_token="agent-token-123", admin_token="admin-token-456")
    assert httpx.get(proxy.url + "/metrics", timeout=10).status_code == 401
    assert httpx.get(proxy.url + "/metrics", headers={"Authorization": "Bearer agent-token-123"},
                     timeout=10).status_code == 403
    m = scrape(proxy.url, Authorization="Bearer admin-token-456")
    assert m[("dressage_calls_total", ())] == 0


def test_group_wait_is_observed_once_per_prompt_group_a_batch_read_hands_over(engine, proxy_stack):
    proxy = proxy_stack(engine.url, min_group_size=2, group_timeout_s=3600.0)
    finalized = proxy.service.trajectories.finalized

    def finish(sid: str, group: str, age_s: float) -> None:
        _chat(proxy.url, sid, f"hello {sid}")
        r = httpx.post(proxy.url + "/session/finalize", json={"session_id": sid, "instance_id": group}, timeout=30)
        assert r.status_code == 200, r.text
        finalized[sid].finalized_at -= age_s  # as if it had finalized age_s earlier

    def read() -> dict:
        r = httpx.post(proxy.url + "/trajectory/read", json={"lease": True}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def waits() -> dict[str, float]:
        m = scrape(proxy.url)
        return {dict(k[1]).get("le", k[0]): v for k, v in m.items() if k[0].startswith("dressage_group_wait_seconds")}

    assert waits()["dressage_group_wait_seconds_count"] == 0
    finish("a-1", "A", 40.0)
    finish("a-2", "A", 1.0)
    finish("b-1", "B", 400.0)
    assert scrape(proxy.url)[("dressage_oldest_unread_seconds", ())] >= 400.0
    first = read()  # A is whole; B has one session of two and waits
    assert {r["trajectory_id"] for g in first["data"] for r in g} == {"a-1", "a-2"}
    assert [g["key"] for g in first["meta_info"]["incomplete_groups"]] == ["B"]
    w = waits()
    assert w["dressage_group_wait_seconds_count"] == 1  # A, from its first finalize (40 s ago) to this read
    assert (w["30.0"], w["60.0"]) == (0, 1)
    finish("b-2", "B", 0.0)
    assert read()["meta_info"]["incomplete_groups"] == []  # B now; A is under the first read's lease
    w = waits()
    assert w["dressage_group_wait_seconds_count"] == 2
    assert (w["300.0"], w["600.0"]) == (1, 2)  # B waited 400 s for its second session
    r = httpx.post(proxy.url + "/trajectory/release", json={"read_id": first["read_id"]}, timeout=30)
    assert r.status_code == 200, r.text
    again = read()  # A handed over again: its wait was told the first time
    assert {r["trajectory_id"] for g in again["data"] for r in g} == {"a-1", "a-2"}
    assert waits()["dressage_group_wait_seconds_count"] == 2


def test_journal_metrics_count_each_fsync_and_the_file_bytes(engine, proxy_stack, tmp_path):
    from dressage.proxy.config import JournalConfig

    proxy = proxy_stack(engine.url, journal=JournalConfig(path=str(tmp_path / "proxy.journal"), fsync="always"))
    journal = proxy.core.journal
    start = journal.fsyncs  # appends made while the Proxy started, before anything observed them
    for sid, text in (("j-a", "one"), ("j-b", "two"), ("j-a", "three")):
        _chat(proxy.url, sid, text)
    r = httpx.post(proxy.url + "/session/finalize", json={"session_id": "j-b", "reward": 0.5}, timeout=30)
    assert r.status_code == 200, r.text
    m = scrape(proxy.url)
    fsyncs = journal.fsyncs - start
    assert fsyncs >= 4  # every step and the finalize, each its own fsync under fsync="always"
    assert m[("dressage_journal_fsync_seconds_count", ())] == fsyncs
    assert m[("dressage_journal_fsync_seconds_sum", ())] > 0
    assert m[("dressage_journal_fsync_seconds_bucket", (("le", "+Inf"),))] == fsyncs
    assert m[("dressage_journal_bytes", ())] == journal.size == (tmp_path / "proxy.journal").stat().st_size


def test_gc_pauses_are_served_as_counted(engine, proxy_stack):
    import gc

    from dressage.serving import GC_PAUSES

    proxy = proxy_stack(engine.url)
    GC_PAUSES.install()  # what a served Proxy does at start (tune_gc_for_serving)
    gc.collect()
    before = GC_PAUSES.snapshot()
    m = scrape(proxy.url)
    after = GC_PAUSES.snapshot()
    # Collections only add up: the scrape reads a value between the two snapshots around it.
    assert 1 <= before["collections"] <= m[("dressage_gc_collections_total", ())] <= after["collections"]
    assert 0 < before["pause_s"] <= m[("dressage_gc_pause_seconds_total", ())] <= after["pause_s"]
    assert 0 < before["max_pause_ms"] / 1e3 <= m[("dressage_gc_max_pause_seconds", ())] <= after["max_pause_ms"] / 1e3
