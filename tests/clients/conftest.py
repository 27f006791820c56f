"""Real coding-agent CLIs (installed from npm by ``make clients``) driven against the real Proxy.

Every test module here marks itself ``clients`` (``pytestmark``). :func:`agent_cli` finds a CLI under
``.deps/agent-clients/node_modules/.bin/`` (the test skips, saying why, when it is not installed);
``scratch_home`` is a throwaway HOME and working directory; :func:`client_env` builds the CLI's
whole environment (nothing of the caller's but ``PATH``); :func:`run_cli` runs it without standard
input, in its own process group, and ends that group (only it) when it is done or the time limit passes.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENTS_BIN = ROOT / ".deps" / "agent-clients" / "node_modules" / ".bin"


def find_cli(name: str) -> Path:
    """The installed CLI ``name`` (``claude``, ``codex``, ``qwen``, ``opencode``); skips the test when absent."""
    path = CLIENTS_BIN / name
    if not os.access(path, os.X_OK):
        pytest.skip(f"{name} is not installed under {CLIENTS_BIN} (run `make clients`; it needs npm)")
    return path


@pytest.fixture
def agent_cli():
    """``agent_cli(name)``: the path of an installed agent CLI, or a skip naming what is missing."""
    return find_cli


@dataclass
class Scratch:
    """A throwaway HOME and working directory for one CLI run."""

    home: Path
    work: Path


@pytest.fixture
def scratch_home(tmp_path: Path) -> Scratch:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    return Scratch(home, work)


def client_env(scratch: Scratch, **env: str) -> dict[str, str]:
    """The CLI's environment: ``PATH``, the scratch HOME and XDG folders, no proxy settings, then ``env``."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(scratch.home), "TERM": "dumb",
            "NO_COLOR": "1", "LANG": "C.UTF-8",
            "XDG_CONFIG_HOME": str(scratch.home / ".config"), "XDG_DATA_HOME": str(scratch.home / ".local/share"),
            "XDG_CACHE_HOME": str(scratch.home / ".cache"), "XDG_STATE_HOME": str(scratch.home / ".local/state")}
    return {**base, **env}


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str


def run_cli(argv: list[str], *, env: dict[str, str], cwd: Path, timeout_s: float) -> CliRun:
    """Run one CLI to its end, or fail the test after ``timeout_s`` (its process group ended first)."""
    proc = subprocess.Popen([str(a) for a in argv], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the CLI's own group: it and the tools it started
        out, err = proc.communicate()
        pytest.fail(f"{Path(argv[0]).name} did not finish within {timeout_s}s; stderr tail: {err[-2000:]}")
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what its tools left running in the background
    except ProcessLookupError:
        pass
    return CliRun(proc.returncode, out, err)
