"""Session ids at the command line (docs/decisions.md#ids-at-the-command-line): every
subcommand taking one answers an id the store's rule refuses with one line on stderr and
exit 2, before anything runs; what the commands print of an id, a worker or a host name
cannot act on the terminal or fake a line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
import pytest
import redis

from dsh_schedule.cli.parser import main
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.wake import ArmRequest
from dsh_schedule.shared.settings import Settings
from dsh_schedule.status import read_status, render_status
from dsh_schedule.terminal import terminal_json, terminal_text

HOSTILE = "a\x1b[2J\x1b[31m\nhealth: ok: all is well\r\x9b2Jb\u2028c\\x1b"

# (what is wrong with the id, the id); each is refused by shared/store/ids.py's one rule.
BAD_IDS = [
    ("empty", ""),
    ("too long once escaped", "A" * 200),
    ("too long", "x" * 250),
    ("not UTF-8 (an argv byte that decodes to a lone surrogate)", "s\udcff"),
]

# Every subcommand that takes a session id, with the id at each place it can stand.
COMMANDS = [
    ("session create", lambda bad: ["session", "create", bad]),
    ("session fork, the parent", lambda bad: ["session", "fork", bad, "child"]),
    ("session fork, the child", lambda bad: ["session", "fork", "b1", bad]),
    ("call", lambda bad: ["call", bad, "schedule_list"]),
    ("host", lambda bad: ["host", bad, "--redis", "redis://127.0.0.1:1/0"]),
    ("host, a later session", lambda bad: ["host", "b1", bad, "--redis", "redis://127.0.0.1:1/0"]),
]


@pytest.fixture
def sessions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(__import__("os").environ):
        if name.startswith("DSH_SCHEDULE_"):
            monkeypatch.delenv(name)
    root = tmp_path / "sessions"
    monkeypatch.setenv("DSH_SCHEDULE_SESSIONS", str(root))
    assert main(["session", "create", "b1"]) == 0
    return root


@pytest.mark.parametrize(("problem", "bad"), BAD_IDS, ids=[row[0] for row in BAD_IDS])
@pytest.mark.parametrize(("command", "argv"), COMMANDS, ids=[row[0] for row in COMMANDS])
def test_a_bad_id_is_one_line_naming_the_rule_and_exit_2(
        command: str, argv: object, problem: str, bad: str, sessions: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # given a session directory holding b1
    capsys.readouterr()
    before = sorted(p.name for p in sessions.iterdir())

    # when the subcommand is given the bad id
    with pytest.raises(SystemExit) as exited:
        main(argv(bad))  # type: ignore[operator]

    # then it stops at its arguments: exit 2, one line that names the rule, nothing made
    out, err = capsys.readouterr()
    assert exited.value.code == 2
    assert out == ""
    assert len(err.splitlines()) == 1 and err.endswith("\n"), err
    assert err.startswith("dsh-schedule: argument ")
    assert "is not a session id: a session id is a non-empty UTF-8 string" in err
    assert "at most 249 bytes" in err
    assert err[:-1].isprintable()  # the id is shown escaped
    assert sorted(p.name for p in sessions.iterdir()) == before


def test_a_hostile_id_is_printed_escaped(sessions: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["session", "create", HOSTILE]) == 0
    assert main(["session", "fork", HOSTILE, HOSTILE + "-child"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [terminal_text(HOSTILE),
                                f"{terminal_text(HOSTILE + '-child')} (seedLength 0)"]
    assert "\x1b" not in out and "\x9b" not in out and "\r" not in out


def test_a_tool_answer_is_printed_to_a_terminal_as_json_safe_to_print(
        sessions: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    capsys.readouterr()
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    prompt = "stretch \x9b2J\u2028now"
    code = main(["call", "b1", "schedule_create",
                 json.dumps({"prompt": prompt, "after_seconds": 600})])
    out = capsys.readouterr().out
    assert code == 0
    assert out.endswith("\n") and out[:-1].isprintable()
    assert json.loads(out)["prompt"] == prompt  # the same value
    # to a script, the tool's own rendering: the characters as they are
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert main(["call", "b1", "schedule_list", "{}"]) == 0
    assert prompt in capsys.readouterr().out


@pytest.mark.parametrize(("text", "shown"), [
    ("plain-id_1", "plain-id_1"),
    ("é and 日本", "é and 日本"),
    ("a\x1b[2J", "a\\x1b[2J"),
    ("one\ntwo\r", "one\\ntwo\\r"),
    ("tab\there", "tab\\there"),
    ("c1 \x9b and del \x7f", "c1 \\x9b and del \\x7f"),
    ("line\u2028sep", "line\\u2028sep"),
    ("a literal \\x1b", "a literal \\\\x1b"),
    ("lone \udcff", "lone \\udcff"),
    ("tag \U000e0041", "tag \\U000e0041"),
])
def test_terminal_text_escapes_what_a_terminal_would_act_on(text: str, shown: str) -> None:
    assert terminal_text(text) == shown
    assert terminal_text(text).isprintable()


def test_terminal_json_is_the_same_value_and_safe_to_print() -> None:
    value = {"id": HOSTILE, "tag": "\U000e0041", "plain": "日本"}
    text = terminal_json(msgspec.json.encode(value).decode())
    assert text.isprintable()
    assert json.loads(text) == value
    assert "日本" in text  # printable text is left as it is


def test_status_shows_hostile_agent_ids_escaped(
        redis_client: redis.Redis, settings: Settings) -> None:
    # given a wake armed for an agent whose id holds escapes and line breaks
    coordination = Coordination(redis_client, settings)
    now = wall_clock_ms()
    coordination.wakes.arm([ArmRequest(HOSTILE, now + 60_000, settings.queue)])

    # when status renders what it read
    report = read_status(redis_client, settings, now_ms=now)
    rendered = render_status(report)

    # then the id is there, escaped: no escape character, no line it did not make
    assert report.next_wakes[0].agent == HOSTILE
    assert f"agent {terminal_text(HOSTILE)}" in rendered
    assert "\x1b" not in rendered and "\x9b" not in rendered and "\r" not in rendered
    assert "\u2028" not in rendered
    assert not any(line.startswith("health: ok: all is well") for line in rendered.splitlines())
    assert len(rendered.splitlines()) == len(render_status(
        msgspec.structs.replace(report, next_wakes=[])).splitlines()) + 1
