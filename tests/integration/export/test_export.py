"""``dressage export``: a Proxy's (or a journal's) finalized trajectories as Parquet, JSONL and slime's
debug-rollout dump, equal value for value to the trajectory read, and the read left in place unless drained;
and the session viewer in a real headless Chromium (Debian's package driven by Playwright, no browser
download): the exported page and the Proxy's live page show the sessions, the step tree with its branch and
history rewrite, the right Segments and trained tokens, and tokens in the loss-mask colours."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil

import httpx
import numpy as np
import pytest

from dressage.cli import main
from dressage.proxy.config import JournalConfig
from dressage.proxy.http.viewer_page import PROMPT_RGB, TRAINED_RGB, UNTRAINED_RGB
from dressage.train.remote import ProxyTrajectorySource

ENGINE = {"tool_call_rate": 0.0, "mean_response_tokens": 8}
SYSTEM = {"role": "system", "content": "You are terse."}


def _auth(token: str | None) -> dict:
    return {"authorization": f"Bearer {token}"} if token else {}


def _chat(url: str, sid: str, messages: list[dict], token: str | None = None) -> str:
    r = httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 8},
                   headers={"X-Session-Id": sid, "X-Instance-Id": "g0", **_auth(token)}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"] or ""


def drive_branch_and_rewrite(url: str, sid: str = "s-tree", token: str | None = None) -> None:
    """Four calls: a turn, its continuation, a branch from the first turn, a rewritten history."""
    first = [SYSTEM, {"role": "user", "content": "list the files"}]
    a1 = _chat(url, sid, first, token)
    turn = first + [{"role": "assistant", "content": a1}]
    _chat(url, sid, turn + [{"role": "user", "content": "now count them"}], token)
    _chat(url, sid, turn + [{"role": "user", "content": "now sort them instead"}], token)
    _chat(url, sid, [SYSTEM, {"role": "user", "content": "summary: files listed; count them"}], token)
    r = httpx.post(url + "/session/finalize", json={"session_id": sid, "instance_id": "g0", "reward": 0.5},
                   headers=_auth(token), timeout=30)
    assert r.status_code == 200, r.text


def _read(url: str, token: str | None = None):
    source = ProxyTrajectorySource(url, token=token)
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
    last = json.loads(rows[-1]["messages"])  # the rewritten history's call, and the reply it got
    assert last[:2] == [SYSTEM, {"role": "user", "content": "summary: files listed; count them"}]
    assert len(last) == 3 and last[2]["role"] == "assistant"
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
    out, html = tmp_path / "j.parquet", tmp_path / "j.html"
    assert main(["export", "--journal", str(journal), "--format", "parquet", "--out", str(out), "--html", str(html),
                 "--tokenizer", "byte"]) == 0
    docs = _embedded(html.read_text())["sessions"]
    assert [d["session_id"] for d in docs] == ["s-tree"] and len(docs[0]["segments"]) == len(samples)
    assert "You are terse." in "".join(docs[0]["segments"][0]["token_text"])
    rows = pq.read_table(out).to_pylist()
    assert [r["tokens"] for r in rows] == [s.tokens.tolist() for s in samples]
    assert [r["loss_mask"] for r in rows] == [s.loss_mask.tolist() for s in samples]
    assert [r["boundary_reason"] for r in rows] == [s.metadata["boundary_reason"] for s in samples]
    assert json.loads(rows[-1]["messages"])[0] == SYSTEM  # the journal keeps what the agent sent


TOOLS = [{"type": "function", "function": {"name": "ls", "description": "List the files of a directory.",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                          "required": ["path"]}}}]


def _tool_chat(url: str, sid: str, messages: list[dict]) -> dict:
    r = httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 1000, "tools": TOOLS,
                                                      "tool_choice": "required"},
                   headers={"X-Session-Id": sid, "X-Instance-Id": "g1"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def test_proxy_and_journal_exports_agree_on_messages_and_tools(proxy_stack, tmp_path):
    """A finalized session keeps the conversation of each Segment's last step: the rows read from the running
    Proxy carry the same messages (tool calls and the final reply included) and tools as the journal's."""
    import pyarrow.parquet as pq

    from dressage.testing.stack import start_engine

    srv = start_engine(tool_call_rate=1.0, mean_response_tokens=8)
    try:
        journal = tmp_path / "proxy.journal"
        proxy = proxy_stack(srv.url, journal=JournalConfig(path=str(journal), fsync="always"))
        drive_branch_and_rewrite(proxy.url)
        sent = [SYSTEM, {"role": "user", "content": "list the files in /tmp"}]
        call = _tool_chat(proxy.url, "s-tools", sent)
        assert call["tool_calls"]
        sent = sent + [call, {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": "a.txt b.txt"}]
        reply = _tool_chat(proxy.url, "s-tools", sent)
        assert reply["tool_calls"]
        r = httpx.post(proxy.url + "/session/finalize", json={"session_id": "s-tools", "reward": 1.0}, timeout=30)
        assert r.status_code == 200, r.text
        from_proxy, from_journal, lines = tmp_path / "p.parquet", tmp_path / "j.parquet", tmp_path / "p.jsonl"
        assert main(["export", "--proxy-url", proxy.url, "--format", "parquet", "--out", str(from_proxy)]) == 0
        assert main(["export", "--proxy-url", proxy.url, "--format", "jsonl", "--out", str(lines)]) == 0
        assert main(["export", "--journal", str(journal), "--format", "parquet", "--out", str(from_journal)]) == 0
    finally:
        srv.stop()
    proxy_rows, journal_rows = pq.read_table(from_proxy).to_pylist(), pq.read_table(from_journal).to_pylist()
    jsonl_rows = [json.loads(line) for line in lines.read_text().splitlines()]

    def conversation(rows):
        return [(r["session_id"], r["segment_index"], r["messages"], r["tools"]) for r in rows]
    assert len(proxy_rows) >= 4 and conversation(proxy_rows) == conversation(journal_rows) == conversation(jsonl_rows)
    assert all(r["messages"] is not None for r in proxy_rows)
    (tool_row,) = [r for r in proxy_rows if r["session_id"] == "s-tools"]
    messages = json.loads(tool_row["messages"])
    assert len(messages) == len(sent) + 1 and messages[:2] == sent[:2] and messages[3] == sent[3]
    assert [c["function"]["name"] for c in messages[2]["tool_calls"]] == ["ls"]  # the agent's turn as it sent it
    assert messages[-1]["role"] == "assistant"  # the final reply, its tool call included
    assert [c["function"] for c in messages[-1]["tool_calls"]] == [c["function"] for c in reply["tool_calls"]]
    assert json.loads(tool_row["tools"]) == TOOLS
    assert all(r["tools"] is None for r in proxy_rows if r["session_id"] == "s-tree")


def test_export_refuses_ambiguous_sources_with_a_clear_error(capsys):
    assert main(["export", "--format", "jsonl", "--out", "x.jsonl"]) == 2
    assert "exactly one of --proxy-url and --journal" in capsys.readouterr().err
    assert main(["export", "--journal", "j", "--format", "jsonl", "--html", "v.html"]) == 2
    assert "--format and --out go together" in capsys.readouterr().err


CHROMIUM = os.environ.get("DRESSAGE_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture
def browser():
    # Function scope: Playwright's sync API holds an event loop on this thread while it runs, which
    # the tests after this one (asyncio.run in dressage run) must not find.
    if not os.path.exists(CHROMIUM) and shutil.which("chromium") is None:
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; `make browser` does it as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the 'test' extra)")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"),
                               args=["--no-sandbox"])
        yield b
        b.close()


def _colour_pixels(png: bytes, rgb: tuple[int, int, int]) -> int:
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    return int(np.all(img == np.array(rgb, dtype=np.uint8), axis=-1).sum())


def test_viewer_renders_tree_segments_and_mask_colours_exported_and_live(engine, proxy_stack, browser, tmp_path):
    agent, admin = "agent-secret", "admin-secret"
    proxy = proxy_stack(engine.url, api_token=agent, admin_token=admin)
    drive_branch_and_rewrite(proxy.url, token=agent)
    _chat(proxy.url, "s-live", [{"role": "user", "content": "still running"}], agent)  # an active session
    samples = _read(proxy.url, admin)
    trained = int(sum(int(s.loss_mask.sum()) for s in samples))
    html, token_file = tmp_path / "report.html", tmp_path / "admin.token"
    token_file.write_text(admin + "\n")
    assert main(["export", "--proxy-url", proxy.url, "--admin-token-file", str(token_file), "--html", str(html)]) == 0
    text = html.read_text()
    for external in ('src="http', "src='http", 'href="http', "url(http", "@import", "<link"):
        assert external not in text  # self-contained: no external assets

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(html.as_uri())
    summary = page.locator("#summary")
    assert summary.get_attribute("data-segments") == str(len(samples))
    assert summary.get_attribute("data-trained-tokens") == str(trained)
    assert page.locator(".segment").count() == len(samples)
    reasons = page.locator(".segment").evaluate_all("els => els.map(e => e.dataset.reason)")
    assert reasons == [s.metadata["boundary_reason"] for s in samples] and "history_rewrite" in reasons
    tree = page.locator("#step-tree").inner_text()
    assert "history_rewrite" in tree and "branch from 0" in tree
    assert page.locator("#step-tree li.step").count() == 4
    hover = page.locator(".tok.m1").first.get_attribute("title")
    assert "logprob" in hover and "version" in hover
    # Tokens read as the Proxy's tokenizer decodes them: the system prompt is legible in the first Segment.
    first = "".join(page.locator(".segment").first.locator(".tok.mp").all_inner_texts()).replace("\u00b7", " ")
    assert "You are terse." in first
    shot = page.screenshot(full_page=True)
    assert _colour_pixels(shot, TRAINED_RGB) > 500
    assert _colour_pixels(shot, UNTRAINED_RGB) > 100  # the user turn between two trained responses
    assert _colour_pixels(shot, PROMPT_RGB) > 500
    page.close()

    # Live: the page is open, the data it polls is not; the admin token comes in the URL fragment.
    assert httpx.get(proxy.url + "/admin/viewer", timeout=10).status_code == 200
    assert httpx.get(proxy.url + "/admin/sessions", timeout=10).status_code == 401
    assert httpx.get(proxy.url + "/admin/sessions", headers=_auth(agent), timeout=10).status_code == 403
    live = browser.new_page()
    live.goto(proxy.url + "/admin/viewer#token=" + admin)
    live.wait_for_function("document.querySelectorAll('.session').length === 2")
    assert "token" not in live.url  # taken out of the address bar
    states = live.locator(".session").evaluate_all("els => els.map(e => [e.dataset.id, e.dataset.state])")
    assert sorted(states) == [["s-live", "active"], ["s-tree", "finalized"]]
    live.wait_for_function(f"document.querySelectorAll('.segment').length === {len(samples)}")
    assert live.locator("#summary").get_attribute("data-trained-tokens") == str(trained)
    live.close()
    assert httpx.get(proxy.url + "/admin/sessions/nope", headers=_auth(admin), timeout=10).status_code == 404


def test_viewer_shows_a_retried_call_and_the_retry_that_continued(engine, proxy_stack, browser, tmp_path):
    proxy = proxy_stack(engine.url)
    first = [SYSTEM, {"role": "user", "content": "list the files"}]
    _chat(proxy.url, "s-retry", first)  # the agent dropped this reply ...
    again = _chat(proxy.url, "s-retry", first)  # ... asked again, and went on from the second one
    _chat(proxy.url, "s-retry", first + [{"role": "assistant", "content": again}, {"role": "user", "content": "count"}])
    r = httpx.post(proxy.url + "/session/finalize", json={"session_id": "s-retry", "reward": 1.0}, timeout=30)
    assert r.status_code == 200, r.text
    samples = _read(proxy.url)
    html = tmp_path / "retry.html"
    assert main(["export", "--proxy-url", proxy.url, "--html", str(html)]) == 0
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(html.as_uri())
    assert page.locator("#step-tree li.step").count() == 3
    dropped, retry = page.locator('li.step[data-step="0"]'), page.locator('li.step[data-step="1"]')
    assert "retried" in dropped.inner_text() and "retried" not in retry.inner_text()
    assert "retry" in retry.locator(".reason").first.inner_text()
    assert page.locator('li.step[data-step="1"] li.step[data-step="2"]').count() == 1  # the continuation hangs there
    reasons = page.locator(".segment").evaluate_all("els => els.map(e => e.dataset.reason)")
    assert reasons == [s.metadata["boundary_reason"] for s in samples] == ["new_session", "retry"]
    # The Segment that continued shows its conversation: what the agent sent and the reply it got.
    assert "count" in page.locator(".segment").nth(1).locator(".messages").inner_text()
    page.close()


def _embedded(page: str) -> dict:
    start = page.index('<script id="viewer-data" type="application/json">') + len(
        '<script id="viewer-data" type="application/json">')
    return json.loads(page[start:page.index("</script>", start)])


def test_run_command_writes_the_session_viewer_and_names_it_before_the_verdict(tmp_path, capsys):
    out, html = tmp_path / "run.json", tmp_path / "report.html"
    rc = main(["run", "--num-rollouts", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
               "--max-turns", "2", "--max-tokens", "32", "--use-rollout-routing-replay", "--enable-transfer-queue",
               "--routed-experts-dtype", "uint8", "--no-progress", "--json", str(out), "--html", str(html),
               "--figures", "docs/img/memory_timeline_full_uint8.png", str(tmp_path / "absent.png")])
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2] == f"session viewer written to {html}" and lines[-1].startswith("PASS")
    report = json.loads(out.read_text())
    data = _embedded(html.read_text())
    assert len(data["sessions"]) == report["sessions"] == 4
    assert sum(len(d["segments"]) for d in data["sessions"]) == report["segments"]
    assert sum(d["trained_tokens"] for d in data["sessions"]) == report["trained_tokens"]
    assert all(d["state"] == "finalized" for d in data["sessions"])
    assert [f["name"] for f in data["figures"]] == ["memory_timeline_full_uint8.png"]
    assert [p["label"] for p in data["timeline"]] == ["rollout 0"] and data["timeline"][0]["bytes"] > 0
    assert data["capacity"]["TQ keys left"] == 0


def test_export_dir_writes_each_finalized_trajectory_as_one_file(engine, proxy_stack, tmp_path):
    import pyarrow.parquet as pq

    from dressage.proxy.config import TrajectoryExportConfig

    out = tmp_path / "trajectories"
    proxy = proxy_stack(engine.url, export=TrajectoryExportConfig(dir=str(out), format="parquet"))
    drive_branch_and_rewrite(proxy.url)
    # No '/' reaches here (the Proxy refuses such an id), but a name of the agent's is never a path of its own.
    drive_branch_and_rewrite(proxy.url, sid="..\\escape:*")
    samples = [s for s in _read(proxy.url) if s.session_id == "s-tree"]
    assert sorted(p.name for p in out.iterdir()) == [".._escape__.parquet", "s-tree.parquet"]  # no temporary left
    rows = pq.read_table(out / "s-tree.parquet").to_pylist()
    _check_rows_equal_read(rows, samples)
    assert _unread(proxy) == ["..\\escape:*", "s-tree"]  # written besides, still read by the trainer


def test_export_with_transfer_queue_restores_without_releasing_and_a_journal_keeps_refs(engine, proxy_stack, tq,
                                                                                         tmp_path, capsys):
    import pyarrow.parquet as pq

    from dressage.train.reader import TrainingReader

    journal = tmp_path / "proxy.journal"
    proxy = proxy_stack(engine.url, tq=tq, journal=JournalConfig(path=str(journal), fsync="always"))
    drive_branch_and_rewrite(proxy.url)
    keys = tq.total_keys()
    assert keys > 0
    out = tmp_path / "tq.parquet"
    assert main(["export", "--proxy-url", proxy.url, "--format", "parquet", "--out", str(out)]) == 0
    assert tq.total_keys() == keys and _unread(proxy) == ["s-tree"]  # the trainer still reads and releases them
    samples = _read(proxy.url)
    TrainingReader(tq.client()).restore(samples)
    rows = pq.read_table(out).to_pylist()
    _check_rows_equal_read(rows, samples)
    assert all(r["large_field_refs"] is None for r in rows)

    capsys.readouterr()
    jl = tmp_path / "refs.jsonl"
    assert main(["export", "--journal", str(journal), "--format", "jsonl", "--out", str(jl)]) == 0
    assert f"{len(samples)} Segments keep large fields as TransferQueue refs" in capsys.readouterr().out
    refs = [json.loads(line) for line in jl.read_text().splitlines()]
    assert [r["tokens"] for r in refs] == [s.tokens.tolist() for s in samples]
    for r, s in zip(refs, samples):
        assert r["rollout_log_probs"] is None and r["r3_ids"] is None
        sizes = json.loads(r["large_field_refs"])
        assert sizes["routed_experts"]["rows"] == len(s.tokens) - 1 and sizes["logprobs"]["rows"] == s.response_length
        assert sizes["routed_experts"]["keys"]
    assert main(["export", "--journal", str(journal), "--format", "slime", "--out", str(tmp_path / "d.pt")]) == 2
    assert "give --tq-spec to restore them" in capsys.readouterr().err
    spec = tmp_path / "tq.json"
    tq.write_client_spec(spec)
    restored = tmp_path / "restored.parquet"
    assert main(["export", "--journal", str(journal), "--tq-spec", str(spec), "--format", "parquet",
                 "--out", str(restored)]) == 0
    _check_rows_equal_read(pq.read_table(restored).to_pylist(), samples)
    assert tq.total_keys() == keys


def test_a_drain_forgets_only_what_was_written_and_releases_its_tq_keys(engine, proxy_stack, tq, tmp_path, capsys):
    proxy = proxy_stack(engine.url, tq=tq)
    drive_branch_and_rewrite(proxy.url)
    keys = tq.total_keys()
    assert keys > 0
    (tmp_path / "a-file").write_text("")
    for bad in (tmp_path / "a-file" / "x.jsonl", tmp_path):  # no directory can be made there; a directory
        assert main(["export", "--proxy-url", proxy.url, "--format", "jsonl", "--out", str(bad), "--drain"]) == 2
        assert "out (--out)" in capsys.readouterr().err
        assert _unread(proxy) == ["s-tree"] and tq.total_keys() == keys  # nothing read, nothing forgotten
    assert main(["export", "--proxy-url", proxy.url, "--format", "jsonl", "--out", str(tmp_path / "t.jsonl"),
                 "--admin-token-file", str(tmp_path / "no-such-file"), "--drain"]) == 2
    assert "admin_token_file (--admin-token-file): cannot read" in capsys.readouterr().err
    out = tmp_path / "new-dir" / "t.jsonl"
    assert main(["export", "--proxy-url", proxy.url, "--format", "jsonl", "--out", str(out), "--drain"]) == 0
    assert out.exists() and _unread(proxy) == []
    assert tq.total_keys() == 0  # the export consumed them: no trainer will ever be handed these refs
