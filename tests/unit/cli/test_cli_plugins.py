"""Subcommands from installed packages: the ``dressage.commands`` entry-point group."""

from __future__ import annotations

import textwrap
from importlib import metadata

import pytest

from dressage import cli


@pytest.fixture
def plugins(monkeypatch, tmp_path):
    """Install fake entry points (name -> "module:function") backed by a module written to tmp_path."""
    (tmp_path / "dressage_fake_plugin.py").write_text(textwrap.dedent("""
        def register(sub):
            p = sub.add_parser("hello", help="says hello")
            p.add_argument("--code", type=int, default=0)
            p.set_defaults(func=lambda args: args.code)

        def register_run(sub):
            raise AssertionError("a plugin may not replace a built-in command")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(**entries: str) -> None:
        eps = [metadata.EntryPoint(name, value, cli.ENTRY_POINT_GROUP) for name, value in entries.items()]
        monkeypatch.setattr(cli.metadata, "entry_points",
                            lambda group=None: [ep for ep in eps if ep.group == group])

    return install


def test_an_entry_point_adds_a_command(plugins):
    plugins(hello="dressage_fake_plugin:register")
    assert cli.main(["hello", "--code", "7"]) == 7
    assert [ep.name for ep in cli.plugin_commands()] == ["hello"]


def test_without_the_bench_package_bench_exits_2_with_a_one_line_hint(plugins, capsys):
    plugins()
    for argv in (["bench", "tq", "--quick"], ["bench", "--help"], ["bench"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "dressage-bench" in err[0] and "pip install -e benchmarks" in err[0]


def test_a_plugin_that_fails_to_import_reports_itself_and_leaves_the_rest(plugins, capsys):
    plugins(bench="dressage_no_such_module:register", hello="dressage_fake_plugin:register")
    assert cli.main(["bench", "tq"]) == 2
    err = capsys.readouterr().err
    assert "dressage_no_such_module" in err and "ModuleNotFoundError" in err
    assert cli.main(["hello", "--code", "3"]) == 3


def test_a_plugin_cannot_replace_a_built_in_command(plugins):
    plugins(run="dressage_fake_plugin:register_run")
    parser = cli.build_parser()               # register_run would raise if it were loaded
    assert cli.plugin_commands() == []
    assert parser.parse_args(["run", "--seed", "3"]).command == "run"


def test_unknown_options_of_a_real_command_are_still_refused(plugins):
    plugins()
    with pytest.raises(SystemExit) as info:
        cli.main(["capacity", "--no-such-flag"])
    assert info.value.code == 2
