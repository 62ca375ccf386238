"""Each subcommand's ``--help`` lists its own options first, every option that takes a
value with its default, and the options the commands share once, in the titled groups
after them; ``status`` and ``health`` take no session directory (they read only Redis)."""

from __future__ import annotations

import argparse

import pytest

from dsh_schedule.cli.options import CONNECTION_GROUP, LOGGING_GROUP
from dsh_schedule.cli.parser import build_parser

SHARED = {"-v", "--verbose", "--log-format", "--log-level", "--rq-log-level", "--sessions",
          "--redis", "--queue", "--prefix", "--redis-wait"}


def subparsers(argv: list[str]) -> dict[str, argparse.ArgumentParser]:
    parser = build_parser(argv)
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


COMMANDS = sorted(subparsers([]))
# loadtest's own options are the load test's (dsh_schedule/loadtest/command.py).
OWN_DEFAULTS_CHECKED = [name for name in COMMANDS if name != "loadtest"]


def command_parser(name: str) -> argparse.ArgumentParser:
    return subparsers([name])[name]


@pytest.mark.parametrize("name", OWN_DEFAULTS_CHECKED)
def test_every_option_with_a_value_says_its_default(name: str) -> None:
    for action in command_parser(name)._actions:
        takes_value = action.option_strings and action.nargs != 0 and not isinstance(
            action, argparse._SubParsersAction | argparse._HelpAction)
        if takes_value:
            assert "default" in (action.help or ""), (name, action.option_strings)


@pytest.mark.parametrize("name", COMMANDS)
def test_the_shared_options_are_shown_once_in_their_groups(name: str) -> None:
    parser = command_parser(name)
    for group in parser._action_groups:
        for action in group._group_actions:
            if SHARED & set(action.option_strings) and name not in ("demo", "loadtest"):
                assert group.title in (LOGGING_GROUP, CONNECTION_GROUP), (name, action.dest)
    text = parser.format_help()
    for option in ("--log-format", "--redis-wait", "--sessions"):
        assert text.count(f"  {option} ") + text.count(f"  {option}\n") <= 1, (name, option)


def test_own_options_come_before_the_shared_groups() -> None:
    text = command_parser("status").format_help()
    assert text.index("--next N") < text.index(LOGGING_GROUP) < text.index(CONNECTION_GROUP)


@pytest.mark.parametrize("name", ["status", "health"])
def test_status_and_health_take_no_session_directory(name: str) -> None:
    parser = command_parser(name)
    assert "--sessions" not in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--sessions", "x"])
