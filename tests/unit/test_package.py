"""The package's public names resolve, and importing a layer does not drag in the ones above it."""

import subprocess
import sys

import dressage


def test_every_public_name_resolves():
    for name in dressage.__all__:
        assert getattr(dressage, name) is not None


def test_rollout_layer_imports_no_transport_stack():
    code = ("import sys, dressage.rollout, dressage.train.reader; "
            "print(sorted(m for m in ('zmq', 'fastapi', 'httpx', 'ray', 'dressage.tq') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_missing_extra_hint_in_a_bare_install():
    # A real run where fastapi cannot be imported: the Proxy command says which extra to install.
    code = ("import sys; sys.modules['fastapi'] = None; from dressage.cli import main; "
            "sys.exit(main(['proxy', 'serve', '--engine-url', 'http://127.0.0.1:9']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().endswith("pip install 'dressage[server]'"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_version_flag_prints_the_installed_version():
    from importlib.metadata import version

    proc = subprocess.run([sys.executable, "-m", "dressage", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == f"dressage {version('dressage')}"
