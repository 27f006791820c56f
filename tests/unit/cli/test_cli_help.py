"""Every option of every command has help text, and shows its default where it has one.

Walks the parser ``dressage`` builds (the commands of this package and those of the installed
``dressage-bench`` package), so a flag added without help fails here.
"""

import argparse
import re

import pytest

from dressage.cli import build_parser
from dressage.cli.reference import leaf_commands

EXPECTED = {"run", "proxy serve", "proxy journal check", "proxy journal repair", "engine serve", "tq serve", "capacity",
            "trainer"}
BENCH = {"bench tq", "bench memory", "bench faults"}


COMMANDS = dict(leaf_commands(build_parser()))


def _default(action):
    """The default the help must state: a config tree's setting keeps argparse's default SUPPRESS
    (flags override a --config file) and records the one it shows as ``config_default``."""
    return getattr(action, "config_default", action.default)


def _has_default(action) -> bool:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction,
                           argparse._HelpAction, argparse._VersionAction)):
        return False  # a switch: off unless given
    return bool(action.option_strings) and _default(action) not in (None, argparse.SUPPRESS, [], ())


def _options(command):
    return [a for a in COMMANDS[command]._actions if not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]


def test_every_command_is_walked():
    assert EXPECTED <= set(COMMANDS)
    if "bench" in COMMANDS:  # the placeholder: dressage-bench is not installed
        pytest.skip("dressage-bench is not installed (`pip install -e benchmarks`); its commands are not checked")
    assert BENCH <= set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_has_help_and_shows_its_default(command):
    parser = COMMANDS[command]
    if any(getattr(a, "dest", None) == "rest" for a in parser._actions):
        pytest.skip(f"dressage {command} is a placeholder for a package that is not installed")
    text = parser.format_help()  # renders every %(default)s; a stray % fails here
    problems = []
    for action in _options(command):
        name = "/".join(action.option_strings) or action.dest
        helptext = action.help or ""
        if not helptext.strip() or helptext == argparse.SUPPRESS:
            problems.append(f"{name}: no help")
        elif _has_default(action):
            rendered = helptext % {**vars(action), "prog": parser.prog} if "%(" in helptext else helptext
            if not re.search(r"\(default\b|default[: ]", rendered, re.IGNORECASE):
                problems.append(f"{name}: default {_default(action)!r} not shown in {rendered!r}")
            elif "%(default)" in helptext and str(_default(action)) not in rendered:
                problems.append(f"{name}: {rendered!r} does not show {_default(action)!r}")
            elif hasattr(action, "config_default") and f"(default: {action.config_default})" not in helptext:
                problems.append(f"{name}: {helptext!r} does not show {action.config_default!r}")
    assert not problems, f"dressage {command}: " + "; ".join(problems)
    assert "(default: " in text or not any(_has_default(a) for a in _options(command))


def test_generated_and_hand_written_defaults_read_the_same():
    run = COMMANDS["run"].format_help()
    assert re.search(r"--context-length TOKENS\s+Context window of the agents.*\(default:\s+2.5K\)", run, re.S)
    assert re.search(r"--engine \{builtin,transformers\}.*\(default: builtin\)", run, re.S)
    assert "(default: 30000)" in COMMANDS["engine serve"].format_help()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_shows_no_python_literals_and_each_default_once(command):
    problems = []
    for action in _options(command):
        helptext = action.help or ""
        if helptext == argparse.SUPPRESS:
            continue
        name = "/".join(action.option_strings) or action.dest
        if "``" in helptext or re.search(r"\bNone\b", helptext):
            problems.append(f"{name}: {helptext!r}")
        if len(re.findall(r"\(default:", helptext, re.IGNORECASE)) > 1:
            problems.append(f"{name}: the default twice in {helptext!r}")
    groups = [g.description or "" for g in COMMANDS[command]._action_groups]
    problems += [f"group: {d!r}" for d in groups if "``" in d or re.search(r"\bNone\b", d)]
    assert not problems, f"dressage {command}: " + "; ".join(problems)


def test_a_field_docstring_reads_as_plain_text_in_help():
    from dressage.flags import help_text

    assert help_text("Fields to offload; ``None``: every field (``logprobs``).") == \
        "Fields to offload; unset: every field (logprobs)."
