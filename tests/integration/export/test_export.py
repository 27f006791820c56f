"""``dressage export``: a Proxy's (or a journal's) finalized trajectories as Parquet, JSONL and slime's
debug-rollout dump, equal value for value to the trajectory read, and the read left in place unless drained."""

from __future__ import annotations

import dataclasses
import json

import httpx
import numpy as np
import pytest

from dressage.cli import main
from dressage.proxy.config import JournalConfig
from dressage.train.remote import ProxyTrajectorySource

ENGINE = {"tool_call_rate": 0.0, "mean_response_tokens": 8}
SYSTEM = {"role": "system", "content": "You are terse."}


def _chat(url: str, sid: str, messages: list[dict]) -> str:
    r = httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 8},
                   headers={"X-Session-Id": sid, "X-Instance-Id": "g0"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"] or ""


def drive_branch_and_rewrite(url: str, sid: str = "s-tree") -> None:
    """Four calls: a turn, its continuation, a branch from the first turn, a rewritten history."""
    first = [SYSTEM, {"role": "user", "content": "list the files"}]
    a1 = _chat(url, sid, first)
    turn = first + [{"role": "assistant", "content": a1}]
    _chat(url, sid, turn + [{"role": "user", "content": "now count them"}])
    _chat(url, sid, turn + [{"role": "user", "content": "now sort them instead"}])
    _chat(url, sid, [SYSTEM, {"role": "user", "content": "summary: files listed; count them"}])
    r = httpx.post(url + "/session/finalize", json={"session_id": sid, "instance_id": "g0", "reward": 0.5}, timeout=30)
    assert r.status_code == 200, r.text


def _read(url: str):
    source = ProxyTrajectorySource(url)
    try:
        return source.read().samples
    finally:
        source.close()


def _unread(proxy) -> list[str]:
    assert httpx.get(proxy.url + "/trajectory/stats", timeout=10).status_code == 200
    return sorted(proxy.service.trajectories.finalized)


def _check_rows_equal_read(rows: list[dict], samples) -> None:
    assert len(rows) == len(samples) >= 2
    for row, s in zip(rows, samples):
        assert (row["session_id"], row["segment_index"]) == (s.session_id, s.segment_index)
        assert row["tokens"] == s.tokens.tolist()
        assert row["loss_mask"] == s.loss_mask.tolist()
        assert row["token_versions"] == s.token_versions.tolist()
        assert np.array_equal(np.asarray(row["rollout_log_probs"], dtype=np.float32), s.rollout_log_probs)
        assert row["response_length"] == s.response_length and row["reward"] == s.reward == 0.5
        assert row["boundary_reason"] == s.metadata["boundary_reason"]
        r3 = np.frombuffer(row["r3_ids"], dtype=row["r3_dtype"]).reshape(row["r3_shape"]).astype(np.int32)
        assert np.array_equal(r3, s.rollout_routed_experts) and r3.shape[0] == len(s.tokens) - 1


def test_parquet_export_reads_back_in_pyarrow_and_datasets_equal_to_the_read(engine, proxy_stack, tmp_path):
    import pyarrow.parquet as pq
    from datasets import Dataset

    proxy = proxy_stack(engine.url)
    drive_branch_and_rewrite(proxy.url)
    samples = _read(proxy.url)
    out = tmp_path / "traj.parquet"
    assert main(["export", "--proxy-url", proxy.url, "--format", "parquet", "--out", str(out)]) == 0
    assert _unread(proxy) == ["s-tree"]  # not drained: the trainer still gets it
    rows = pq.read_table(out).to_pylist()
    _check_rows_equal_read(rows, samples)
    assert {r["boundary_reason"] for r in rows} >= {"history_rewrite"}
    assert any(r["branch_from"] is not None for r in rows)
    assert rows[-1]["messages"] is None  # a finalized session's steps no longer hold messages (the journal does)
    ds = Dataset.from_parquet(str(out))
    assert len(ds) == len(samples)
    _check_rows_equal_read([ds[i] for i in range(len(ds))], samples)


def test_jsonl_and_slime_dump_and_drain(engine, proxy_stack, tmp_path):
    import base64

    import torch

    from dressage.integrations.slime import SlimeSample

    proxy = proxy_stack(engine.url)
    drive_branch_and_rewrite(proxy.url)
    samples = _read(proxy.url)
    jl = tmp_path / "traj.jsonl"
    assert main(["export", "--proxy-url", proxy.url, "--format", "jsonl", "--out", str(jl)]) == 0
    rows = [json.loads(line) for line in jl.read_text().splitlines()]
    for r in rows:
        r["r3_ids"] = base64.b64decode(r["r3_ids"])
    _check_rows_equal_read(rows, samples)

    dump = tmp_path / "rollout_{rollout_id}.pt"
    assert main(["export", "--proxy-url", proxy.url, "--format", "slime", "--out", str(dump), "--drain"]) == 0
    assert _unread(proxy) == []  # drained: acknowledged after the file was written
    data = torch.load(tmp_path / "rollout_0.pt", weights_only=False)
    assert data["rollout_id"] == 0 and len(data["samples"]) == len(samples)
    names = {f.name for f in dataclasses.fields(SlimeSample)}
    for d, s in zip(data["samples"], samples):
        assert names <= set(d) and d["status"] == "completed"
        loaded = SlimeSample(**{k: v for k, v in d.items() if k in names and k != "status"})  # slime's from_dict
        assert loaded.tokens == s.tokens.tolist() and all(type(t) is int for t in loaded.tokens)
        assert loaded.loss_mask == s.loss_mask.tolist() and loaded.response_length == s.response_length
        assert all(type(x) is float for x in loaded.rollout_log_probs)
        assert np.array_equal(np.asarray(loaded.rollout_log_probs, dtype=np.float32), s.rollout_log_probs)
        r3 = loaded.rollout_routed_experts
        assert isinstance(r3, torch.Tensor) and r3.dtype == torch.int32
        assert np.array_equal(r3.numpy(), s.rollout_routed_experts)
        assert loaded.reward == 0.5 and loaded.session_id == "s-tree"


def test_journal_export_equals_the_proxy_read_and_keeps_messages(engine, proxy_stack, tmp_path):
    import pyarrow.parquet as pq

    journal = tmp_path / "proxy.journal"
    proxy = proxy_stack(engine.url, journal=JournalConfig(path=str(journal), fsync="always"))
    drive_branch_and_rewrite(proxy.url)
    samples = _read(proxy.url)
    out = tmp_path / "j.parquet"
    assert main(["export", "--journal", str(journal), "--format", "parquet", "--out", str(out)]) == 0
    rows = pq.read_table(out).to_pylist()
    assert [r["tokens"] for r in rows] == [s.tokens.tolist() for s in samples]
    assert [r["loss_mask"] for r in rows] == [s.loss_mask.tolist() for s in samples]
    assert [r["boundary_reason"] for r in rows] == [s.metadata["boundary_reason"] for s in samples]
    assert json.loads(rows[-1]["messages"])[0] == SYSTEM  # the journal keeps what the agent sent


def test_export_refuses_ambiguous_sources_with_a_clear_error(capsys):
    assert main(["export", "--format", "jsonl", "--out", "x.jsonl"]) == 2
    assert "exactly one of --proxy-url and --journal" in capsys.readouterr().err
    assert main(["export", "--journal", "j", "--format", "jsonl", "--html", "v.html"]) == 2
    assert "--format and --out go together" in capsys.readouterr().err
