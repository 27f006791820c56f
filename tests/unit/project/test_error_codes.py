"""Every error class has its own stable snake_case ``code``, and the generated reference pages
(``docs/reference/errors.md``, ``commands.md``, ``endpoints.md``) are what the code would write now."""

import ast
import pathlib
import re

import pytest

import dressage.errors as errors
from dressage.cli.reference import commands_page, endpoints_page, error_classes, errors_page

ROOT = pathlib.Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "docs" / "reference"


def test_the_walk_finds_every_public_error_class():
    assert {c.__name__ for c in error_classes()} == set(errors.__all__)


@pytest.mark.parametrize("cls", error_classes(), ids=lambda c: c.__name__)
def test_each_class_sets_its_own_snake_case_code(cls):
    assert "code" in vars(cls), f"{cls.__name__} inherits its code; give it its own"
    assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", cls.code), cls.code


def test_codes_are_unique():
    codes = [c.code for c in error_classes()]
    assert sorted(codes) == sorted(set(codes))


def test_an_unknown_session_is_unknown_session_not_a_class_name():
    assert errors.UnknownSessionError.code == "unknown_session"
    assert issubclass(errors.UnknownSessionError, errors.UnknownStepError)  # callers that catch the parent still do


def test_the_error_table_matches_the_error_tree():
    page = (REFERENCE / "errors.md").read_text(encoding="utf-8")
    assert page == errors_page(), "run `python -m dressage.cli.reference docs/reference`"
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (?:&nbsp;)*`(\w+)` \| (\d+) \|", page, re.M)
    assert {(name, code, int(status)) for code, name, status in rows} == \
        {(c.__name__, c.code, c.http_status) for c in error_classes()}


def test_codes_set_on_an_instance_are_in_the_table():
    """A ``err.code = "..."`` in the sources must name a code the table documents."""
    known = {c.code for c in error_classes()}
    for path in (ROOT / "src" / "dressage").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and target.attr == "code" \
                            and isinstance(node.value.value, str):
                        assert node.value.value in known, f"{path}: code {node.value.value!r} is not in the table"


def test_the_commands_reference_matches_the_config_trees():
    page = (REFERENCE / "commands.md").read_text(encoding="utf-8")
    assert page == commands_page(), "run `python -m dressage.cli.reference docs/reference`"
    for needle in ("## `dressage proxy serve`", "| `--server.port`, `--port` | `server.port` |",
                   "## `dressage run`", "`--transfer-queue-config` | `transfer_queue.config` |"):
        assert needle in page, needle


def test_the_endpoints_reference_matches_the_proxy_app():
    pytest.importorskip("fastapi")
    page = (REFERENCE / "endpoints.md").read_text(encoding="utf-8")
    assert page == endpoints_page(), "run `python -m dressage.cli.reference docs/reference`"
    assert "| POST | `/sessions/{session_id}/v1/chat/completions` |" in page
    assert "| POST | `/trajectory/ack` | Trajectory Ack | `read_id`* |" in page
