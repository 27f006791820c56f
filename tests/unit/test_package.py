"""The package's public names resolve, and importing a layer does not drag in the ones above it."""

import pathlib
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


SRC = pathlib.Path(dressage.__file__).resolve().parent
BENCH_SRC = SRC.parents[1] / "benchmarks" / "src" / "dressage_bench"


def test_testing_kit_imports_nothing_above_the_transfer_queue():
    code = ("import sys, dressage.testing.faults, dressage.testing.wirefuzz; "
            "print(sorted(m for m in ('dressage.proxy', 'dressage.rollout', 'dressage.train', 'dressage.harness.run', "
            "'pytest', 'dressage_bench') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"   # fault injection and the fuzzer need neither pytest nor the upper layers


def test_the_product_does_not_import_the_benchmarks_and_no_module_is_over_400_lines():
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        assert "dressage_bench" not in text, path
        assert len(text.splitlines()) <= 400, f"{path} has {len(text.splitlines())} lines"
    for path in BENCH_SRC.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path


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
