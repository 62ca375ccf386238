"""The lifecycle switch changes nothing a caller that never updates can see
(docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders): the same calls, with
the switch off and on, answer byte for byte the same and write byte for byte the same
logs, for version-1 records and calendar rules in zones, through the tools and through
``dsh-schedule call``, and as the code before the lifecycle did (the digests in
``data/parity-before-lifecycle.json``); ``check``, ``fold`` and ``present`` print the
same. Only the catalog differs, as the issue says: ``schedule_update`` fourth and
``limit_exceeded`` among the codes (and ``until`` and ``count`` on create, views that may
show them).

The whole suite runs with the switch on too: ``DSH_SCHEDULE_LIFECYCLE=on python3 dev.py
test PATHS`` (tests/switched.py)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from dsh_schedule import cli as cli_module
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core import catalog
from dsh_schedule.shared.core.errors import V1_ERROR_CODES
from dsh_schedule.shared.core.events import (
    STEP_START,
    TURN_START,
    USER_MESSAGE,
    NewEvent,
    SessionHeader,
)
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests import switched
from tests.integration.test_cli import cli_env
from tests.integration.v1log import dispatch_due, write_v1_log
from tests.support import T0, FakeClock, process_env

DATA = Path(__file__).parent / "data"
LIFECYCLE_KEYS = {"until", "count", "deliveredCount", "paused"}

# Every create form and every create error a caller without the lifecycle can meet
# (``until`` and ``count`` aside: with the switch off they are unknown keys).
CREATES: list[Any] = [
    {"prompt": "stand-up", "cron": {"expression": "0 9 * * MON-FRI",
                                    "time_zone": "Europe/Berlin"}},
    {"prompt": "weekly review", "cron": {"expression": "30 8 * * 1"}},
    {"prompt": "nightly", "cron": "0 2 * * *"},
    {"prompt": "monthly", "cron": {"expression": "0 18 1 * *", "time_zone": "Asia/Kolkata"}},
    {"prompt": "  stretch  ", "after_seconds": 90},
    {"prompt": "check CI", "every_seconds": 300},
    {"prompt": "water the plants", "every_seconds": 3600.0},
    {"prompt": "call the office", "at": "2026-12-01T13:00:00+01:00"},
    {"prompt": "dinner", "at": {"date": "2026-12-24", "time": "18:00:00",
                                "time_zone": "America/New_York"}},
    {"prompt": "local", "at": {"date": "2026-12-02", "time": "07:30:00"}},
    {"prompt": "in the gap", "at": {"date": "2027-03-14", "time": "02:30:00",
                                    "time_zone": "America/New_York"}},
    {"prompt": "twice", "at": {"date": "2027-11-07", "time": "01:30:00",
                               "time_zone": "America/New_York"}},
    {"prompt": "soon gone", "after_seconds": 30},
    # errors
    [],
    {"prompt": "x"},
    {"prompt": "x", "after_seconds": 60, "every_seconds": 600},
    {"prompt": "x", "after_seconds": 60, "repeat": True},
    {"prompt": "", "after_seconds": 60},
    {"prompt": " \t ", "after_seconds": 60},
    {"prompt": 7, "after_seconds": 60},
    {"prompt": "x" * 40_000, "after_seconds": 60},
    {"prompt": "\ud800", "after_seconds": 60},
    {"prompt": "x", "after_seconds": 0},
    {"prompt": "x", "after_seconds": 1.5},
    {"prompt": "x", "after_seconds": True},
    {"prompt": "x", "after_seconds": "60"},
    {"prompt": "x", "after_seconds": 2**53},
    {"prompt": "x", "after_seconds": 9_007_199_254_740},
    {"prompt": "x", "every_seconds": 299},
    {"prompt": "x", "every_seconds": -5},
    {"prompt": "x", "at": "2026-13-01T00:00:00Z"},
    {"prompt": "x", "at": "2026-11-30T00:00:00Z"},
    {"prompt": "x", "at": {"date": "2026-12-24", "time": "18:00:00", "time_zone": "Mars/Base"}},
    {"prompt": "x", "at": {"date": "2026-12-24", "time": "18:00"}},
    {"prompt": "x", "cron": "* * * * *"},
    {"prompt": "x", "cron": "61 * * * *"},
    {"prompt": "x", "cron": {"expression": "0 9 * * *", "time_zone": "Mars/Base"}},
    {"prompt": "x", "cron": {"expression": "0 9 * * *", "time_zone": 3}},
    {"prompt": "x", "cron": {"rule": "0 9 * * *"}},
    {"prompt": "x", "cron": "0 9 30 2 *"},
    {"prompt": "x", "cron": "0 18 L * *"},
]
OTHERS: list[tuple[str, Any]] = [
    ("schedule_list", {}),
    ("schedule_list", None),
    ("schedule_list", {"all": True}),
    ("schedule_delete", {"id": "schedule-99"}),
    ("schedule_delete", {"id": " schedule-1"}),
    ("schedule_delete", {}),
    ("schedule_delete", {"id": "schedule-1", "force": True}),
    ("schedule_delete", {"id": "schedule-2"}),
    ("schedule_delete", {"id": "schedule-2"}),
    ("schedule_list", {}),
]


def _open_turn(store: JsonlStore, session: str, zones: list[str]) -> None:
    """An open turn whose user messages name ``zones`` and a time reading."""
    events = [NewEvent(type=TURN_START, time=T0, data={"turn": 0})]
    events += [NewEvent(type=USER_MESSAGE, time=T0, data={
        "content": [{"type": "text", "text": "hi"}],
        "source": {"kind": "user", "rpcId": f"r{i}", "clientTimeZone": zone}})
        for i, zone in enumerate(zones)]
    events.append(NewEvent(type=USER_MESSAGE, time=T0, data={
        "content": [{"type": "text", "text": "now"}],
        "source": {"kind": "plugin", "plugin": "time-context", "form": "reading"}}))
    events.append(NewEvent(type=STEP_START, time=T0, data={"turn": 0, "step": 0}))
    store.append(session, events, expected_seq=len(store.read(session).events))


def run_sessions(sessions: Path, *, lifecycle: bool, calendar: bool) -> list[str]:
    """Every call of CREATES and OTHERS in three sessions (a confirmed zone, a zone not
    confirmed, no zone), then their due occurrences delivered over a week and each listed
    along the way; each answer as ``error|ok content``."""
    settings = Settings.from_env({}, sessions=sessions, prefix="parity:", queue="parity",
                                 calendar=calendar, lifecycle=lifecycle)
    store = JsonlStore(sessions)
    clock = FakeClock()
    tools = ScheduleTools(store, Coordination(fakeredis.FakeRedis(), settings), settings, clock)
    assert (tools.lifecycle, tools.calendar) == (lifecycle, calendar)
    answers: list[str] = []
    soon_gone: list[str] = []

    def call(session: str, tool: str, args: Any) -> None:
        result = tools.call(session, tool, args)
        answers.append(f"{'error' if result.is_error else 'ok'} {result.content}")
        if isinstance(args, dict) and args.get("prompt") == "soon gone":
            soon_gone.append(str(result.value.get("id")))

    for session, zone in (("confirmed", "America/New_York"), ("unconfirmed", "Europe/Berlin"),
                          ("zoneless", None)):
        store.create(SessionHeader(id=session, createdAt=T0, timeZone=zone))
        if session == "confirmed":
            _open_turn(store, session, ["America/New_York"])
        for args in CREATES:
            call(session, "schedule_create", args)
        for tool, args in OTHERS:
            call(session, tool, args)
    start = clock()
    for step_s in (60, 3_600, 86_400, 3 * 86_400, 7 * 86_400):
        clock.now_ms = start + step_s * 1000
        for session in ("confirmed", "unconfirmed", "zoneless"):
            dispatch_due(store, session, clock())
            call(session, "schedule_list", {})
    call("confirmed", "schedule_delete", {"id": soon_gone[0]})  # delivered: not found
    call("confirmed", "schedule_delete", {"id": "schedule-1"})
    call("confirmed", "schedule_list", {})
    return answers


@pytest.mark.parametrize("calendar", [False, True])
def test_answers_and_logs_are_the_same_with_the_lifecycle_on(
    tmp_path: Path, calendar: bool,
) -> None:
    # given the same calls and the same clock, with the lifecycle off and on
    off = run_sessions(tmp_path / "off", lifecycle=False, calendar=calendar)
    on = run_sessions(tmp_path / "on", lifecycle=True, calendar=calendar)
    # then every answer is the same, byte for byte
    assert len(on) == len(off)
    for i, (said_off, said_on) in enumerate(zip(off, on, strict=True)):
        assert said_on == said_off, f"answer {i} differs"
    # and so is every log
    for name in ("confirmed", "unconfirmed", "zoneless"):
        written = (tmp_path / "on" / f"{name}.jsonl").read_bytes()
        assert written == (tmp_path / "off" / f"{name}.jsonl").read_bytes(), name
        assert b'"operation":"update"' not in written
    # and the scenario met what it means to: ok answers, every create code, deliveries,
    # views and no view with a lifecycle field
    codes = {json.loads(a.split(" ", 1)[1])["code"] for a in on if a.startswith("error")}
    expected = {"invalid_prompt", "invalid_selector", "invalid_rule", "invalid_time_zone",
                "timezone_confirmation_required", "not_future", "time_out_of_range",
                "frequency_too_high"}
    assert codes == expected
    views = [view for a in on if a.startswith("ok [")
             for view in json.loads(a.split(" ", 1)[1])]
    assert views and not any(LIFECYCLE_KEYS & view.keys() for view in views)
    assert {view["kind"] for view in views} == (
        {"after", "at", "every", "cron"} if calendar else {"after", "at", "every"})
    assert on[-3].endswith('"deleted":false,"code":"schedule_not_found"}')
    for name in ("confirmed", "unconfirmed", "zoneless"):
        assert (tmp_path / "on" / f"{name}.jsonl").read_text().count(
            '"operation":"dispatch"') >= 5
    # and both are what the code before the lifecycle answered and wrote
    assert _digests(off, tmp_path / "off") == BEFORE[
        "calendar" if calendar else "no calendar"]


# The SHA-256 of the answers (one a line) and of each log that ``run_sessions`` gave on the
# last commit before the lifecycle (493c9d7), and of its catalog exports (as JSON);
# regenerate only from that code.
BEFORE: dict[str, dict[str, str]] = json.loads(
    (DATA / "parity-before-lifecycle.json").read_text())


def _digests(answers: list[str], sessions: Path) -> dict[str, str]:
    digests = {"answers": hashlib.sha256("\n".join(answers).encode()).hexdigest()}
    for name in ("confirmed", "unconfirmed", "zoneless"):
        digests[name] = hashlib.sha256((sessions / f"{name}.jsonl").read_bytes()).hexdigest()
    return digests


def test_the_version_1_log_and_its_answers_are_the_same_with_the_lifecycle_on(
    tmp_path: Path,
) -> None:
    off: list[str] = []
    on: list[str] = []
    written_off = write_v1_log(tmp_path / "off", lifecycle=False, answers=off).read_bytes()
    written_on = write_v1_log(tmp_path / "on", lifecycle=True, answers=on).read_bytes()
    assert written_on == written_off == (DATA / "v1-log.jsonl").read_bytes()
    assert on == off and len(on) == 7


def _main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
          env: dict[str, str], *argv: str) -> tuple[int, str]:
    with monkeypatch.context() as patched:
        for name, setting in env.items():
            patched.setenv(name, setting)
        code = cli_module.main(list(argv))
    return code, capsys.readouterr().out


def test_the_commands_say_the_same_with_the_lifecycle_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    # given a sessions directory of each, and no Redis named (an embedded one)
    for name in list(os.environ):
        if name.startswith("DSH_SCHEDULE_"):
            monkeypatch.delenv(name)
    calls = [
        ("schedule_create", {"prompt": "call the office", "at": "2099-12-01T13:00:00+01:00"}),
        ("schedule_create", {"prompt": "new year", "cron": {
            "expression": "0 0 1 1 *", "time_zone": "Pacific/Auckland"}}),
        ("schedule_create", {"prompt": "x", "every_seconds": 60}),
        ("schedule_create", {"prompt": "x", "at": "2000-01-01T00:00:00Z"}),
        ("schedule_list", {}),
        ("schedule_delete", {"id": "schedule-1"}),
        ("schedule_delete", {"id": "schedule-1"}),
        ("schedule_list", {}),
    ]
    said: dict[str, list[tuple[int, str]]] = {}
    for switch in ("off", "on"):
        env = {"DSH_SCHEDULE_SESSIONS": str(tmp_path / switch),
               "DSH_SCHEDULE_CALENDAR": "on", "DSH_SCHEDULE_LIFECYCLE": switch}
        assert _main(monkeypatch, capsys, env, "session", "create", "s")[0] == 0
        said[switch] = [_main(monkeypatch, capsys, env, "call", "s", tool, json.dumps(args))
                        for tool, args in calls]
    # then each call answers the same, with the same exit code
    assert said["on"] == said["off"]
    assert [code for code, _out in said["on"]] == [0, 0, 3, 3, 0, 0, 0, 0]
    # and the logs hold the same records
    datas = {switch: [json.loads(line).get("data") for line in
                      (tmp_path / switch / "s.jsonl").read_text().splitlines()[1:]]
             for switch in ("off", "on")}
    assert datas["on"] == datas["off"]
    # and check, fold and present print the same of one log whatever the switch says
    log = str(tmp_path / "off" / "s.jsonl")
    for argv in (("check", log), ("fold", log, "--now", "2099-12-01T12:00:00Z"),
                 ("present", log, "2")):
        printed = {switch: _main(monkeypatch, capsys, {"DSH_SCHEDULE_LIFECYCLE": switch}, *argv)
                   for switch in ("off", "on")}
        assert printed["on"] == printed["off"], argv
        assert printed["on"][0] == 0, printed


def test_the_catalog_gains_only_what_the_issue_names() -> None:
    # The catalog with the lifecycle on: the three tools first, schedule_update fourth;
    # list and delete take the same arguments; every code the three answered is still
    # offered, and limit_exceeded is the one added.
    for calendar in (False, True):
        off = catalog.catalog_json(calendar, False)
        on = catalog.catalog_json(calendar, True)
        assert [t["name"] for t in on] == [*(t["name"] for t in off), "schedule_update"]
        for before, after in zip(off[1:3], on[1:3], strict=True):
            assert after["inputSchema"] == before["inputSchema"]
        create_before = off[0]["inputSchema"]["properties"]
        create_after = on[0]["inputSchema"]["properties"]
        assert {k: v for k, v in create_after.items() if k not in ("until", "count")} == (
            create_before)
        for tool in on[:3]:
            offered = _codes(tool["outputSchema"])
            assert offered == {*V1_ERROR_CODES, "limit_exceeded"}, tool["name"]
        for tool in off:
            assert _codes(tool["outputSchema"]) == set(V1_ERROR_CODES)
    # and off, every export is the one of the code before the lifecycle
    for export in (catalog.catalog_json, catalog.openai_tools, catalog.anthropic_tools):
        for calendar in (False, True):
            name = f"{export.__name__} calendar={calendar}"
            digest = hashlib.sha256(json.dumps(export(calendar, False), ensure_ascii=False)
                                    .encode()).hexdigest()
            assert digest == BEFORE["catalog"][name], name


def _codes(schema: Any) -> set[str]:
    """The error codes an output schema offers (its ``code`` enums)."""
    found: set[str] = set()
    if isinstance(schema, dict):
        code = schema.get("properties", {}).get("code")
        if isinstance(code, dict) and "enum" in code:
            found.update(code["enum"])
        for value in schema.values():
            found |= _codes(value)
    elif isinstance(schema, list):
        for item in schema:
            found |= _codes(item)
    return found


def test_a_run_with_the_switch_on_builds_every_settings_with_it(tmp_path: Path) -> None:
    # The CI's second run (DSH_SCHEDULE_LIFECYCLE=on, .ci/run) is one with the lifecycle
    # on: a Settings that does not name it has it, one that does keeps its own, and the
    # processes and commands the tests start are told.
    on = switched.lifecycle_suite()
    assert Settings().lifecycle is on
    assert Settings.from_env({}).lifecycle is on
    assert Settings(lifecycle=False).lifecycle is False
    assert (process_env("redis://127.0.0.1:1/0", tmp_path).get(switched.SWITCH) == "on") is on
    assert (cli_env().get(switched.SWITCH) == "on") is on
