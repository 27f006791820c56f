"""``dressage run``'s own checks: the verdict line and the start-up check of ``--engine-url``."""

import http.server
import json
import socket
import threading

import pytest

from dressage.cli import main
from dressage.errors import ConfigError, EngineTimeout, EngineUnavailable
from dressage.harness.run.loop import RunReport
from dressage.harness.run.probe import check_engine_reachable
from dressage.harness.run.verdict import judge

SMALL = ["--num-rollouts", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--max-turns", "2",
         "--max-tokens", "32", "--no-progress"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_run_arguments_end_with_a_pass_verdict_computed_from_both_runs(tmp_path, capsys):
    out = tmp_path / "run.json"
    rc = main(["run", *SMALL, "--use-rollout-routing-replay", "--enable-transfer-queue",
               "--routed-experts-dtype", "uint8", "--compare-without-tq", "--json", str(out)])
    printed = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["verdict"]["ok"] is True
    assert data["baseline_samples_digest"] == data["samples_digest"]
    assert printed[-1] == data["verdict"]["line"]
    assert printed[-1].startswith("PASS: 4 sessions without errors (")
    assert "0 TQ keys left" in printed[-1]
    assert f"TQ on/off samples identical (digest {data['samples_digest'][:8]})" in printed[-1]


def test_make_run_defaults_exercise_context_compression_and_the_verdict_counts_it(tmp_path, capsys):
    # The Makefile's RUN_ARGS with every agent default (one rollout of the default shape).
    out = tmp_path / "run.json"
    rc = main(["run", "--num-rollouts", "1", "--no-progress", "--use-rollout-routing-replay",
               "--enable-transfer-queue", "--routed-experts-dtype", "uint8", "--compare-without-tq",
               "--json", str(out)])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0
    data = json.loads(out.read_text())
    agent = data["agent"]
    assert agent["compressions"] > 0 and agent["retries"] > 0 and agent["tool_calls"] > 0
    # Each compression starts a new Segment of its session.
    assert data["segments"] >= data["sessions"] + agent["compressions"]
    assert line.startswith(f"PASS: {data['sessions']} sessions without errors ({agent['turns']} turns, "
                           f"{agent['tool_calls']} tool calls, {agent['retries']} retries, "
                           f"{agent['compressions']} compressions), ")
    assert data["baseline_samples_digest"] == data["samples_digest"]


def test_a_run_whose_keys_cannot_be_counted_ends_with_a_fail_verdict_naming_the_unit(tmp_path, capsys,
                                                                                     monkeypatch):
    """A StorageUnit that does not answer the final count: the promise of 0 keys left cannot be shown, so
    the verdict fails naming the unit (exit 1), with the rest of the report; not an error with no report."""
    from dressage.errors import StorageUnitUnavailable
    from dressage.tq import TransferQueue

    def total_keys(self):
        raise StorageUnitUnavailable("cannot count keys of unit unit0: StorageUnit unit0 is unavailable (stats: "
                                     "no reply within 2 s)")

    monkeypatch.setattr(TransferQueue, "total_keys", total_keys)
    out = tmp_path / "run.json"
    rc = main(["run", *SMALL, "--enable-transfer-queue", "--json", str(out)])
    captured = capsys.readouterr()
    assert rc == 1
    line = captured.err.strip().splitlines()[-1]
    assert line.startswith("FAIL: TQ keys left after consumption unknown: cannot count keys of unit unit0: ")
    assert "(passed: 4 sessions without errors" in line and "error:" not in captured.err
    data = json.loads(out.read_text())
    assert data["tq_keys_left"] is None and "unit0" in data["tq_keys_uncounted"]
    assert [r["tq_keys_left"] for r in data["rollouts"]] == [None] * len(data["rollouts"])
    assert data["segments"] > 0 and "TQ keys left" in captured.out and "unknown (cannot count keys" in captured.out


def test_compare_without_tq_needs_tq_on(capsys):
    assert main(["run", *SMALL, "--compare-without-tq"]) == 2
    assert capsys.readouterr().err.strip() == ("dressage run: error: --compare-without-tq compares a run with TQ "
                                               "to one without: add --enable-transfer-queue")


def _report(**kw) -> RunReport:
    base = dict(config={"enable_transfer_queue": True}, sessions=4, segments=5, agent={"errors": 0},
                samples_digest="ab" * 32)
    base.update(kw)
    return RunReport(**base)


def test_verdict_fails_on_each_check_and_names_the_figure():
    assert judge(_report()).line == "PASS: 4 sessions without errors, 5 samples checked, 0 TQ keys left"
    counted = _report(agent={"errors": 0, "turns": 9, "tool_calls": 3, "retries": 1, "compressions": 2})
    assert judge(counted).line == ("PASS: 4 sessions without errors (9 turns, 3 tool calls, 1 retry, 2 compressions), "
                                   "5 samples checked, 0 TQ keys left")
    v = judge(_report(tq_keys_left=3))
    assert not v.ok and v.failed == ("3 TQ keys left after consumption",)
    assert v.line.startswith("FAIL: 3 TQ keys left after consumption (passed: 4 sessions")
    v = judge(_report(), _report(samples_digest="cd" * 32))
    assert v.failed == ("TQ on/off samples differ (digest abababab with TQ, cdcdcdcd without)",)
    assert judge(_report(agent={"errors": 2})).failed == ("2 agent sessions failed",)
    assert judge(_report(segments=0)).failed == ("no Samples reached the trainer",)
    # TQ off: no key check at all.
    assert "TQ keys" not in judge(_report(config={"enable_transfer_queue": False}, tq_keys_left=3)).line


def test_a_failed_verdict_names_the_first_cause_of_each_kind():
    v = judge(_report(agent={"errors": 3}, first_errors={"timeout": "rollout 1: chat: no answer in 5 s",
                                                         "status_400": "rollout 0: chat: 400: prompt too long"}))
    assert v.failed == ("3 agent sessions failed (first cause of each kind: status_400: rollout 0: chat: 400: "
                        "prompt too long; timeout: rollout 1: chat: no answer in 5 s)",)


def test_a_run_whose_sessions_all_fail_says_why_on_stderr_and_in_json(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["run", *SMALL, "--context-length", "1K", "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("dressage run: error: rollout 0 produced no Samples: all 4 agent sessions failed; "
                          "first cause of each kind: status_400: chat: ")
    assert "context window is 1024 tokens" in err
    data = json.loads(out.read_text())
    assert data["verdict"]["ok"] is False and data["error"]["code"] == "agent_error"
    assert data["error"]["message"] in err and "context window is 1024 tokens" in data["verdict"]["line"]


def test_a_run_with_some_failed_sessions_names_their_cause_in_the_verdict(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["run", "--num-rollouts", "1", "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
                 "--no-progress", "--context-length", "1536", "--json", str(out)]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    data = json.loads(out.read_text())
    assert line == data["verdict"]["line"]
    assert line.startswith("FAIL: ") and "agent sessions failed (first cause of each kind: status_400: rollout 0: " \
        in line and "context window is 1536 tokens" in line
    assert set(data["first_errors"]) == {"status_400"}


def test_verdict_on_r3_replay_figures():
    good = {"samples": 2, "tokens": 10, "identical_tokens": 10, "max_abs_diff": 0.0, "max_sum_abs_diff": 0.0}
    assert judge(_report(replay=good)).passed[-2:] == ("R3 replay reproduces 10 logprobs bit for bit",
                                                      "sequence logprob within 1e-06")
    off = {**good, "identical_tokens": 7, "max_abs_diff": 0.25, "max_sum_abs_diff": 2e-6}
    assert judge(_report(replay=off)).failed == (
        "R3 replay: 3 of 10 logprobs differ (max |diff| 0.25)",
        "R3 replay: a sequence's logprob is off by 2e-06 (> 1e-06)")
    # Nothing compared is no proof.
    assert not judge(_report(replay={**good, "tokens": 0, "identical_tokens": 0})).ok


def test_unreachable_engine_url_is_one_line_naming_url_and_cause(capsys):
    url = f"http://127.0.0.1:{_closed_port()}"
    rc = main(["run", *SMALL, "--engine-url", url])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err == f"dressage run: error: engine {url} is unreachable: connection refused by 127.0.0.1:{url.rsplit(':', 1)[1]}"


def test_an_unreachable_ray_address_is_one_line_naming_the_flag(capsys):
    address = f"127.0.0.1:{_closed_port()}"
    assert main(["run", *SMALL, "--ray-address", address]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dressage run: error: cluster.ray_address (--ray-address): nothing answers at {address!r}")
    assert err.count("\n") == 0


def test_engine_url_dns_failure_and_bad_urls():
    with pytest.raises(EngineUnavailable, match=r"engine http://no-such-host\.invalid:30000 is unreachable: "
                                                r"DNS lookup of 'no-such-host\.invalid' failed"):
        check_engine_reachable("http://no-such-host.invalid:30000")
    for bad in ("localhost:30000", "ftp://127.0.0.1:1", "http://127.0.0.1:notaport"):
        with pytest.raises(ConfigError, match="--engine-url"):
            check_engine_reachable(bad)


def test_engine_url_that_accepts_but_never_answers_times_out():
    with socket.socket() as listener:  # the kernel completes the handshake; nobody ever reads
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(EngineTimeout, match=rf"engine {url} did not answer GET /health within 0.3 s"):
            check_engine_reachable(url, timeout_s=0.3)


class _Status(http.server.BaseHTTPRequestHandler):
    status = 503

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status, ok", [(200, True), (404, True), (503, False)])
def test_engine_health_status(status, ok):
    handler = type("H", (_Status,), {"status": status})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        if ok:
            check_engine_reachable(url)
        else:
            with pytest.raises(EngineUnavailable, match=rf"engine {url} is not ready: GET /health answered HTTP 503"):
                check_engine_reachable(url)
    finally:
        srv.shutdown()
        srv.server_close()
