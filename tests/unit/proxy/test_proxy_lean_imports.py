"""The Proxy's process imports httpx without httpx's console command (rich, pygments)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def test_proxy_stack_skips_httpx_cli() -> None:
    pytest.importorskip("rich")  # without httpx's CLI extras there is nothing to skip
    out = _run("import sys\n"
               "import dressage.proxy.deployment, dressage.proxy.http.app\n"
               "print(sorted(m for m in ('httpx._main', 'rich', 'pygments') if m in sys.modules))")
    assert out == "[]"


def test_httpx_cli_still_importable_after() -> None:
    pytest.importorskip("rich")
    out = _run("import dressage.proxy.engines.sglang_client, httpx, httpx._main\n"
               "print(type(httpx._main.main).__name__, httpx.main is not httpx._main.main)")
    assert out == "Command True"  # the console command loads on demand; httpx kept its stub


def test_httpx_already_imported_is_used_as_is() -> None:
    out = _run("import sys, httpx\n"
               "from dressage.proxy.engines.httpx_lean import httpx as lean\n"
               "print(lean is httpx, sys.modules.get('httpx._main', 0) is not None)")
    assert out == "True True"
