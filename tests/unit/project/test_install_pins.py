"""Installing dressage keeps a user's torch; `make` installs the exact CPU wheel the tests run with."""

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _requirements(pyproject: pathlib.Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    return [*project.get("dependencies", []), *(r for reqs in project.get("optional-dependencies", {}).values()
                                                for r in reqs)]


def test_no_extra_pins_an_exact_version():
    for pyproject in (ROOT / "pyproject.toml", ROOT / "benchmarks" / "pyproject.toml"):
        torch = [r for r in _requirements(pyproject) if re.match(r"torch\b", r)]
        assert torch, pyproject
        for req in torch:
            assert "==" not in req and ">=" in req, f"{pyproject.name}: {req!r} would replace a user's torch"


def test_make_installs_with_the_constraints_file_pinning_cpu_torch():
    pins = [line.split("#")[0].strip() for line in (ROOT / "constraints.txt").read_text().splitlines()]
    assert "torch==2.13.0" in pins
    makefile = (ROOT / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if "-e '.[" in line]  # the product and its extras
    assert len(installs) == 2  # make venv / test / run, and make bench
    for line in installs:
        assert line.strip().startswith("$(PIP_INSTALL) "), line
    assert re.search(r"^PIP_INSTALL := .*pip install .*-c constraints\.txt", makefile, re.M)
