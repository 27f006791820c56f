"""Every ``dressage run`` command the README and docs show parses, and builds a valid RunConfig."""

import pathlib
import re
import shlex

import pytest

from dressage.cli import build_parser
from dressage.cli.run import run_config

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _commands() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
        spans = re.findall(r"`([^`\n]*(?:\n[^`\n]*)?)`", re.sub(r"```.*?```", "", text, flags=re.S))
        lines = [line for b in blocks for line in b.replace("\\\n", " ").splitlines()]
        lines += [s.replace("\n", " ") for s in spans]  # an inline command may wrap onto a second line
        for line in lines:
            line = " ".join(line.split(" #")[0].split())
            if (path.name, line) not in found and re.match(r"^(?:\.venv/bin/)?dressage run(\s.*)?$", line):
                found.append((path.name, line))
    return found


COMMANDS = _commands()


def test_the_documented_commands_are_found():
    lines = [c for _, c in COMMANDS]
    assert any("--compare-without-tq" in c for c in lines)  # make run's
    assert any("--engine transformers" in c for c in lines)
    assert any("--transfer-queue-config examples/transfer_queue.yaml" in c for c in lines)


@pytest.mark.parametrize("where, command", COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in COMMANDS])
def test_documented_run_command_is_accepted(where, command, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands run from the repository root
    argv = shlex.split(command)
    argv = argv[argv.index("run"):]
    args = build_parser().parse_args(argv)
    cfg = run_config(args)
    if "--engine transformers" in command:
        assert cfg.inference.backend == "transformers" and cfg.data_plane.model.name == "tiny-qwen3-moe"
