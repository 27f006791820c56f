"""``dressage run``'s report paths are checked before the run, its flags offer only what it can do,
and a run that loses Samples ends with a FAIL verdict (exit status 1), not a usage error."""

from __future__ import annotations

import json

import pytest

from dressage.cli import build_parser, main
from dressage.errors import LostSamplesError


@pytest.fixture
def no_run(monkeypatch):
    """The run itself: refused paths must stop the command before it is called."""
    calls = []

    def run_and_judge(cfg):
        calls.append(cfg)
        raise AssertionError("the run started")

    monkeypatch.setattr("dressage.harness.run.verdict.run_and_judge", run_and_judge)
    return calls


@pytest.mark.parametrize("flag", ["--json", "--html"])
@pytest.mark.parametrize("target, needle", [
    ("FILE/x.out", "is a file, not a folder"),
    ("FILE/sub/x.out", "is a file, not a folder"),
    ("/proc/dressage-nope.out", "cannot write '/proc/dressage-nope.out'"),
    ("DIR", "is a directory"),
])
def test_a_report_path_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys, no_run, flag, target,
                                                                        needle):
    (tmp_path / "FILE").write_text("x")
    path = str(tmp_path) if target == "DIR" else target.replace("FILE", str(tmp_path / "FILE"))
    assert main(["run", flag, path]) == 2
    err = capsys.readouterr().err
    key = "report.json (--json)" if flag == "--json" else "report.html (--html)"
    assert err.startswith(f"dressage run: error: {key}: ") and needle in err and err.count("\n") == 1
    assert not no_run


def test_a_missing_report_folder_is_made_and_the_check_leaves_no_file(tmp_path):
    from dressage.flags import check_writable

    path = tmp_path / "out" / "deeper" / "run.json"
    check_writable(str(path), "report.json (--json)", make_parents=True)
    assert path.parent.is_dir() and not path.exists()
    path.parent.joinpath("run.json").write_text("old")
    check_writable(str(path), "report.json (--json)", make_parents=True)
    assert path.read_text() == "old"  # an existing report is kept until the run writes its own


def test_run_does_not_offer_the_transfer_queue_spec_flags_and_refuses_them_in_yaml(tmp_path, capsys):
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices and "run" in a.choices)
    text = sub.choices["run"].format_help()
    assert "spec-out" not in text and "spec_out" not in text and "--transfer-queue-spec" not in text
    assert "--transfer-queue-config" in text
    path = tmp_path / "run.yaml"
    path.write_text("data_plane: {enable_transfer_queue: true}\ntransfer_queue: {spec_out: tq.json}\n")
    assert main(["run", "--config", str(path)]) == 2
    assert capsys.readouterr().err == ("dressage run: error: transfer_queue.spec_out: dressage run trains in its "
                                       "own processes, which join its TransferQueue without a file\n")
    with pytest.raises(SystemExit) as exc:
        main(["run", "--transfer-queue-spec-out", "tq.json"])
    assert exc.value.code == 2 and "unrecognized arguments: --transfer-queue-spec-out" in capsys.readouterr().err


def test_a_run_that_loses_samples_ends_with_a_fail_verdict_and_exit_status_1(tmp_path, capsys, monkeypatch):
    lost = LostSamplesError("2 Samples lost their large fields (4 keys; e.g. key 's/1/logprobs' not found): "
                            "s#0, t#0", samples=["s#0", "t#0"], keys=["s/1/logprobs"])

    def run_and_judge(cfg):
        raise lost

    monkeypatch.setattr("dressage.harness.run.verdict.run_and_judge", run_and_judge)
    out = tmp_path / "out" / "run.json"
    assert main(["run", "--no-progress", "--json", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"FAIL: {lost}" and "error:" not in err[-1]
    data = json.loads(out.read_text())
    assert data["verdict"] == {"ok": False, "passed": [], "failed": [str(lost)], "line": f"FAIL: {lost}"}
    assert data["error"]["code"] == "samples_lost"
