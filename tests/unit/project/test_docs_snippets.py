"""Every code block of README.md and docs/ is run, checked or marked as not runnable; every relative
link resolves; the docs site builds with no warning.

A fenced block's info string says what it is:
- ``python``: run (in a fresh namespace, from the repository root). A ``<!-- run-with-proxy -->`` line
  just before it runs it against a real engine and Proxy whose URL is ``$DRESSAGE_PROXY_URL``;
  ``<!-- not-run: why -->`` only compiles it.
- ``bash``: checked in a cheap form: ``bash -n``, and every ``dressage ...`` command in it must parse,
  and build its configuration where the command has one, with the flags it shows (a file it names that
  is not on this machine is let pass). ``<!-- not-run: why -->`` (a synopsis): ``bash -n`` only.
- ``yaml``, ``json``: parsed, unless ``<!-- not-run: why -->`` (a shape with placeholders).
- ``text``, ``console``: output, diagrams and transcripts, not run.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import shlex
import subprocess
from dataclasses import dataclass

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)\s*(?P<info>[\w+-]*)[^\n]*$")
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>not-run|run-with-proxy)\s*(?::\s*(?P<why>.*?))?\s*-->\s*$")
NOT_RUN = {"text", "console"}
CHECKED = {"python", "bash", "yaml", "json"}


@dataclass(frozen=True)
class Block:
    page: pathlib.Path
    line: int
    lang: str
    marker: str | None
    why: str | None
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(page: pathlib.Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, indent, fence = i, len(m.group("indent")), m.group("fence")
        prev = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        mark = MARKER.match(prev)
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        out.append(Block(page, start + 1, m.group("info"), mark.group("kind") if mark else None,
                         mark.group("why") if mark else None, "\n".join(body) + "\n"))
        i += 1
    return out


BLOCKS = [b for page in PAGES for b in _blocks(page)]


def _of(lang: str, marker: str | None = None) -> list[Block]:
    return [b for b in BLOCKS if b.lang == lang and b.marker == marker]


def test_blocks_are_found_in_the_pages_and_the_site():
    assert len(BLOCKS) > 20
    assert _of("python", "run-with-proxy") and _of("bash") and _of("yaml")


def test_every_code_block_says_what_it_is():
    unknown = [f"{b.id}: ```{b.lang or '(no language)'}" for b in BLOCKS if b.lang not in NOT_RUN | CHECKED]
    assert not unknown, "mark each block python/bash/yaml/json (checked) or text/console (not run): " + \
        ", ".join(unknown)
    unexplained = [b.id for b in BLOCKS if b.marker == "not-run" and not b.why]
    assert not unexplained, "a <!-- not-run: why --> marker says why: " + ", ".join(unexplained)


@pytest.mark.parametrize("block", _of("python"), ids=lambda b: b.id)
def test_python_block_runs(block, monkeypatch):
    monkeypatch.chdir(ROOT)
    exec(compile(block.code, block.id, "exec"), {"__name__": "docs_snippet"})


@pytest.mark.parametrize("block", _of("python", "not-run"), ids=lambda b: b.id)
def test_python_block_marked_not_run_compiles(block):
    compile(block.code, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_python_blocks_that_need_a_proxy_run_against_one(engine, proxy_stack, monkeypatch):
    monkeypatch.chdir(ROOT)
    for block in _of("python", "run-with-proxy"):
        proxy = proxy_stack(engine.url)
        monkeypatch.setenv("DRESSAGE_PROXY_URL", proxy.url)
        exec(compile(block.code, block.id, "exec"), {"__name__": "docs_snippet"})
        states = [s.state for s in proxy.core.sessions.values()]
        assert states and set(states) == {"finalized"}, f"{block.id}: sessions left {states}"


def _commands(code: str) -> list[list[str]]:
    """Each ``dressage ...`` command of a shell block, as argv after ``dressage``."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        line = line.split(" #")[0].strip().rstrip("&").strip()
        if not line or line.startswith("#"):
            continue
        argv = shlex.split(line)
        if argv and argv[0] in ("dressage", ".venv/bin/dressage"):
            out.append(argv[1:])
    return out


def _build_config(argv: list[str]) -> None:
    """Parse ``dressage ARGV`` and, for the commands that have one, build its configuration."""
    from dressage.cli import build_parser

    args = build_parser().parse_args(argv)
    builders = {"run": ("dressage.cli.run", "run_config"), "trainer": ("dressage.cli.trainer", "trainer_config")}
    if argv[:2] == ["proxy", "serve"]:
        from dressage.cli.proxy import proxy_config

        proxy_config(args)
    elif argv[0] in builders:
        import importlib

        module, name = builders[argv[0]]
        getattr(importlib.import_module(module), name)(args)


def _bash_syntax(block: Block) -> None:
    syntax = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
    assert syntax.returncode == 0, f"{block.id}: {syntax.stderr}"


@pytest.mark.parametrize("block", _of("bash"), ids=lambda b: b.id)
def test_bash_block_is_valid_and_its_dressage_commands_parse(block, monkeypatch):
    from dressage.errors import ConfigError

    _bash_syntax(block)
    monkeypatch.chdir(ROOT)
    for argv in _commands(block.code):
        try:
            _build_config(argv)
        except SystemExit as exc:  # argparse's answer to a flag that does not exist
            pytest.fail(f"{block.id}: dressage {' '.join(argv)}: exit {exc.code}")
        except ConfigError as exc:
            if not isinstance(exc.__cause__ or exc.__context__, FileNotFoundError):
                raise  # a file the example names (/run/secrets/...) need not exist here; anything else counts


@pytest.mark.parametrize("block", _of("bash", "not-run"), ids=lambda b: b.id)
def test_bash_block_marked_not_run_is_valid_shell(block):
    _bash_syntax(block)


@pytest.mark.parametrize("block", _of("yaml") + _of("json"), ids=lambda b: b.id)
def test_data_block_parses(block):
    if block.lang == "yaml":
        yaml.safe_load(block.code)
    else:
        json.loads(block.code)


def test_a_shell_command_with_a_flag_that_does_not_exist_fails_the_check():
    (argv,) = _commands("dressage proxy serve --engine-url http://e:1 \\\n    --no-such-flag 1 &\n")
    with pytest.raises(SystemExit):
        _build_config(argv)


# -- links ------------------------------------------------------------------------------------------
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower()).replace("_", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*$", text, re.M)}


def _links(page: pathlib.Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [m.group("target") for m in LINK.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not this test's to fetch
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Title\n\n[ok](#title) [gone](missing.md) [bad](p.md#nowhere) `[code](x.md)`\n")
    assert _links(page) == ["#title", "missing.md", "p.md#nowhere"]
    assert _slug("`dressage bench memory`: end to end, with TQ") == "dressage-bench-memory-end-to-end-with-tq"
    assert _anchors(page) == {"title"}


# -- the site ---------------------------------------------------------------------------------------
def test_the_docs_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([os.sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "reference" / "errors" / "index.html").is_file()
    assert (tmp_path / "site" / "img" / "deployment-two-node.svg").is_file()
