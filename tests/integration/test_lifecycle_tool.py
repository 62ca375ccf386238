"""The lifecycle switch and ``schedule_update`` (docs/decisions.md#lifecycle-editing-pausing-
and-ending-reminders): ``lifecycle=True`` on the plugins, ``DSH_SCHEDULE_LIFECYCLE=on`` for
the commands; disabled, every answer, definition and log is the one without it, and logs
holding its records are read either way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from dsh_schedule.host.aio import AsyncSchedulePlugin
from dsh_schedule.host.plugin import AgentWithTools, SchedulePlugin
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core import catalog
from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.core.instant import format_instant
from dsh_schedule.shared.settings import Settings, SettingsError, lifecycle_from_env
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.integration.test_cli import cli
from tests.support import FakeClock
from tests.switched import lifecycle_suite

FAR = "2099-01-01T00:00:00Z"


@pytest.mark.parametrize(("value", "on"), [("on", True), ("off", False), ("1", True),
                                           ("no", False), ("", False)])
def test_the_environment_switch(value: str, on: bool) -> None:
    env = {"DSH_SCHEDULE_LIFECYCLE": value}
    # An empty switch leaves the default, which a run with the lifecycle on changed
    # (tests/switched.py).
    assert Settings.from_env(env).lifecycle is (on or (value == "" and lifecycle_suite()))
    assert lifecycle_from_env(env) is on


def test_malformed_settings_are_clear_errors() -> None:
    with pytest.raises(SettingsError, match="lifecycle must be on or off"):
        Settings.from_env({"DSH_SCHEDULE_LIFECYCLE": "maybe"})
    with pytest.raises(SettingsError, match="lifecycle must be on or off"):
        lifecycle_from_env({"DSH_SCHEDULE_LIFECYCLE": "maybe"})
    for bad in ("0", "-1", "ten", "1.5"):
        with pytest.raises(SettingsError, match="max_active must be a whole number"):
            Settings.from_env({"DSH_SCHEDULE_MAX_ACTIVE": bad})
    assert Settings.from_env({"DSH_SCHEDULE_MAX_ACTIVE": "7"}).max_active == 7
    assert Settings.from_env({}).max_active == 100


def tools_of(settings: Settings, lifecycle: bool | None = True, *, calendar: bool = False,
             clock: FakeClock | None = None) -> tuple[ScheduleTools, JsonlStore]:
    store = JsonlStore(settings.sessions)
    if not store.exists("s1"):
        store.create(SessionHeader(id="s1", createdAt=0))
    coordination = Coordination(fakeredis.FakeRedis(), settings)
    tools = ScheduleTools(store, coordination, settings, clock or FakeClock(),
                          calendar=calendar, lifecycle=lifecycle)
    return tools, store


def datas(store: JsonlStore) -> list[Any]:
    return [event.data for event in store.read("s1").events]


@pytest.mark.parametrize(("setting", "argument", "on"), [
    (False, None, False), (True, None, True), (False, True, True), (True, False, False)])
def test_the_plugin_argument_overrides_the_setting(
    settings: Settings, setting: bool, argument: bool | None, on: bool,
) -> None:
    switched = Settings.from_env({}, sessions=settings.sessions, prefix=settings.prefix,
                                 lifecycle=setting)
    coordination = Coordination(fakeredis.FakeRedis(), switched)
    plugin = SchedulePlugin(store=JsonlStore(switched.sessions), coordination=coordination,
                            settings=switched, lifecycle=argument)
    agent: AgentWithTools[Any] = AgentWithTools("s1")
    plugin._on_agent_created(agent)
    assert [d for d, _h in agent.tools.values()] == catalog.tool_definitions(lifecycle=on)
    assert ("schedule_update" in agent.tools) is on
    plugin.dispose()


@pytest.mark.parametrize("lifecycle", [False, True])
def test_the_async_plugin_takes_the_switch(settings: Settings, lifecycle: bool) -> None:
    plugin = AsyncSchedulePlugin(
        store=JsonlStore(settings.sessions), settings=settings,
        coordination=Coordination(fakeredis.FakeRedis(), settings), lifecycle=lifecycle,
    )
    assert plugin.tools.lifecycle is lifecycle
    assert plugin.sync.tools.lifecycle is lifecycle
    plugin.sync.dispose()


def test_disabled_the_answers_and_the_log_are_todays(settings: Settings) -> None:
    settings = msgspec_replace(settings, lifecycle=False)
    tools, store = tools_of(settings, lifecycle=None)
    made = tools.call("s1", "schedule_create", {"prompt": "x", "every_seconds": 600})
    assert not made.is_error
    assert "deliveredCount" not in made.value
    for args in ({"prompt": "x", "every_seconds": 600, "count": 3},
                 {"prompt": "x", "every_seconds": 600, "until": FAR}):
        assert tools.call("s1", "schedule_create", args).value["code"] == "invalid_selector"
    unknown = tools.call("s1", "schedule_update", {"id": "schedule-1", "paused": True})
    assert unknown.value == {"code": "invalid_selector",
                             "message": "Unknown tool 'schedule_update'."}
    # no cap without the switch
    capped = msgspec_replace(settings, max_active=1)
    more, _ = tools_of(capped, lifecycle=None)
    assert not more.call("s1", "schedule_create", {"prompt": "y", "at": FAR}).is_error
    assert [d["version"] for d in datas(store)] == [1, 1]


def msgspec_replace(settings: Settings, **changes: Any) -> Settings:
    import msgspec

    return msgspec.structs.replace(settings, **changes)


def test_an_update_appends_only_what_changed_and_answers_the_view(settings: Settings) -> None:
    clock = FakeClock()
    tools, store = tools_of(settings, clock=clock)
    made = tools.call("s1", "schedule_create", {"prompt": "call mum", "after_seconds": 600})
    # a prompt-only change keeps the timing
    edited = tools.call("s1", "schedule_update", {"id": "schedule-1", "prompt": " call dad "})
    assert edited.value == {**made.value, "prompt": "call dad"}
    # a timing change keeps the id and is counted from now
    clock.advance(60)
    retimed = tools.call("s1", "schedule_update", {"id": "schedule-1", "after_seconds": 1200})
    assert retimed.value["id"] == "schedule-1"
    assert retimed.value["scheduledAt"] == format_instant(clock() + 1_200_000)
    # the same values again change nothing and append nothing
    again = tools.call("s1", "schedule_update", {"id": "schedule-1", "prompt": "call dad"})
    assert again.value == retimed.value
    assert datas(store)[1:] == [
        {"version": 2, "operation": "update", "id": "schedule-1", "prompt": "call dad"},
        {"version": 2, "operation": "update", "id": "schedule-1", "kind": "after",
         "afterSeconds": 1200, "scheduledAt": retimed.value["scheduledAt"]},
    ]
    assert tools.call("s1", "schedule_list", {}).value == [retimed.value]


def test_pause_is_changed_only_when_told(settings: Settings) -> None:
    tools, _store = tools_of(settings)
    tools.call("s1", "schedule_create", {"prompt": "water", "every_seconds": 600})
    paused = tools.call("s1", "schedule_update", {"id": "schedule-1", "paused": True})
    assert paused.value["state"] == "paused"
    retimed = tools.call("s1", "schedule_update", {"id": "schedule-1", "every_seconds": 900})
    assert retimed.value["state"] == "paused" and retimed.value["everySeconds"] == 900
    resumed = tools.call("s1", "schedule_update", {"id": "schedule-1", "paused": False})
    assert resumed.value["state"] == "scheduled"


def test_unknown_or_ended_ids_answer_not_found_after_the_preflight(settings: Settings) -> None:
    tools, store = tools_of(settings)
    tools.call("s1", "schedule_create", {"prompt": "x", "at": FAR})
    tools.call("s1", "schedule_delete", {"id": "schedule-1"})
    for schedule_id in ("schedule-1", "schedule-7"):
        result = tools.call("s1", "schedule_update", {"id": schedule_id, "prompt": "y"})
        assert not result.is_error
        assert result.value == {"id": schedule_id, "updated": False, "code": "schedule_not_found"}
    assert len(datas(store)) == 2


@pytest.mark.parametrize(("args", "code"), [
    ({"id": "schedule-1"}, "invalid_selector"),
    ({"id": "schedule-1", "at": FAR, "every_seconds": 600}, "invalid_selector"),
    ({"id": "schedule-1", "prompt": " "}, "invalid_prompt"),
    ({"id": "schedule-1", "every_seconds": 299}, "frequency_too_high"),
    ({"id": "schedule-1", "at": "2000-01-01T00:00:00Z"}, "not_future"),
    ({"id": "schedule-1", "at": {"date": "2099-01-01", "time": "09:00:00"}},
     "timezone_confirmation_required"),
    ({"id": "schedule-1", "at": {"date": "2099-01-01", "time": "09:00:00", "time_zone": "Mars/X"}},
     "invalid_time_zone"),
    ({"id": "schedule-1", "paused": "yes"}, "invalid_rule"),
    ({"id": "schedule-1", "count": 0}, "invalid_rule"),
    ({"id": "schedule-1", "until": None}, "invalid_rule"),
    ({"id": "schedule-1", "until": FAR}, "invalid_rule"),  # on a one-shot
])
def test_update_arguments_answer_creates_codes_and_change_nothing(
    settings: Settings, args: dict[str, Any], code: str,
) -> None:
    tools, store = tools_of(settings)
    tools.call("s1", "schedule_create", {"prompt": "x", "at": FAR})
    result = tools.call("s1", "schedule_update", args)
    assert result.is_error and result.value["code"] == code, result.value
    assert len(datas(store)) == 1


def test_end_conditions_on_create(settings: Settings) -> None:
    clock = FakeClock()
    tools, store = tools_of(settings, clock=clock)
    until = format_instant(clock() + 3_600_000)
    made = tools.call("s1", "schedule_create",
                      {"prompt": "stretch", "every_seconds": 600, "until": until, "count": 3})
    assert made.value["until"] == until and made.value["count"] == 3
    assert made.value["deliveredCount"] == 0
    assert datas(store)[0]["version"] == 2
    for args, code in [
        ({"prompt": "x", "after_seconds": 60, "count": 2}, "invalid_rule"),
        ({"prompt": "x", "at": FAR, "until": FAR}, "invalid_rule"),
        ({"prompt": "x", "every_seconds": 600, "count": 1.5}, "invalid_rule"),
        ({"prompt": "x", "every_seconds": 600, "until": format_instant(clock() + 1000)},
         "invalid_rule"),
        ({"prompt": "x", "every_seconds": 600, "until": "2000-01-01T00:00:00Z"}, "not_future"),
        ({"prompt": "x", "every_seconds": 600, "until": FAR, "colour": 1}, "invalid_selector"),
    ]:
        assert tools.call("s1", "schedule_create", args).value["code"] == code, args
    assert len(datas(store)) == 1
    # a count of 3.0 is the integer 3, as the seconds are; the record holds 3
    whole = tools.call("s1", "schedule_create", {"prompt": "x", "every_seconds": 600.0,
                                                 "count": 3.0})
    assert not whole.is_error and whole.value["count"] == 3
    assert datas(store)[-1]["schedule"]["count"] == 3
    assert isinstance(datas(store)[-1]["schedule"]["count"], int)
    edited = tools.call("s1", "schedule_update", {"id": "schedule-2", "count": 4.0})
    assert not edited.is_error and datas(store)[-1] == {
        "version": 2, "operation": "update", "id": "schedule-2", "count": 4}


def test_the_cap_answers_limit_exceeded_and_appends_nothing(settings: Settings) -> None:
    capped = msgspec_replace(settings, max_active=2)
    tools, store = tools_of(capped)
    for prompt in ("a", "b"):
        assert not tools.call("s1", "schedule_create", {"prompt": prompt, "at": FAR}).is_error
    refused = tools.call("s1", "schedule_create", {"prompt": "c", "after_seconds": 60})
    assert refused.is_error and refused.value["code"] == "limit_exceeded"
    assert "2 active reminders" in refused.value["message"]
    assert len(datas(store)) == 2
    # an ended record frees its place
    tools.call("s1", "schedule_delete", {"id": "schedule-1"})
    assert not tools.call("s1", "schedule_create", {"prompt": "c", "at": FAR}).is_error


def test_records_written_with_the_switch_are_read_without_it(settings: Settings) -> None:
    on, _store = tools_of(settings)
    on.call("s1", "schedule_create", {"prompt": "x", "every_seconds": 600, "count": 2})
    view = on.call("s1", "schedule_update", {"id": "schedule-1", "paused": True}).value
    off, _ = tools_of(settings, lifecycle=False)
    assert off.call("s1", "schedule_list", {}).value == [view]
    assert off.call("s1", "schedule_delete", {"id": "schedule-1"}).value == {
        "id": "schedule-1", "deleted": True}


def test_the_catalog_command_prints_the_variant_the_switch_names() -> None:
    for fmt, export in [("catalog", catalog.catalog_json), ("openai", catalog.openai_tools),
                        ("anthropic", catalog.anthropic_tools)]:
        on = cli("catalog", "--format", fmt, env={"DSH_SCHEDULE_LIFECYCLE": "on"})
        assert json.loads(on.stdout) == export(False, True)
        both = cli("catalog", "--format", fmt,
                   env={"DSH_SCHEDULE_LIFECYCLE": "on", "DSH_SCHEDULE_CALENDAR": "on"})
        assert json.loads(both.stdout) == export(True, True)
    assert "lifecycle must be on or off" in cli(
        "catalog", env={"DSH_SCHEDULE_LIFECYCLE": "maybe"}).stderr


def test_call_with_the_switch_and_check_fold_present(tmp_path: Path) -> None:
    env = {"DSH_SCHEDULE_SESSIONS": str(tmp_path / "sessions")}
    assert cli("session", "create", "s", env=env).returncode == 0
    on_env = {**env, "DSH_SCHEDULE_LIFECYCLE": "on"}
    create = cli("call", "s", "schedule_create",
                 json.dumps({"prompt": "x", "every_seconds": 600, "count": 3}), env=on_env)
    assert create.returncode == 0, create.stdout + create.stderr
    args = json.dumps({"id": "schedule-1", "paused": True})
    off = cli("call", "s", "schedule_update", args, env={**env, "DSH_SCHEDULE_LIFECYCLE": "off"})
    assert off.returncode != 0 and "unknown tool" in off.stderr
    on = cli("call", "s", "schedule_update", args, env=on_env)
    assert on.returncode == 0, on.stdout + on.stderr
    assert json.loads(on.stdout)["state"] == "paused"
    log = tmp_path / "sessions" / "s.jsonl"
    assert cli("check", str(log)).returncode == 0
    listed = json.loads(cli("fold", str(log)).stdout)
    assert [(v["state"], v["count"], v["deliveredCount"]) for v in listed] == [("paused", 3, 0)]


def test_check_fold_and_present_read_every_lifecycle_record(tmp_path: Path) -> None:
    from tests.integration.test_cli import write_log

    log = write_log(tmp_path / "s.jsonl", [
        {"version": 2, "operation": "create", "schedule": {
            "id": "schedule-1", "kind": "every", "prompt": "water", "everySeconds": 600,
            "scheduledAt": "2026-12-01T10:00:00.000Z", "until": "2026-12-01T12:00:00.000Z",
            "count": 3}},
        {"version": 1, "operation": "dispatch", "id": "schedule-1",
         "acceptedAt": "2026-12-01T10:00:00.000Z"},
        {"version": 2, "operation": "update", "id": "schedule-1", "prompt": "water the plants",
         "paused": True},
        {"version": 2, "operation": "update", "id": "schedule-1", "paused": False,
         "scheduledAt": "2026-12-01T11:00:00.000Z"},
        {"version": 1, "operation": "dispatch", "id": "schedule-1",
         "acceptedAt": "2026-12-01T11:05:00.000Z"},
    ])
    assert cli("check", str(log)).returncode == 0
    # each receipt shows the prompt and occurrence in force at its dispatch
    first = json.loads(cli("present", str(log), "1").stdout)
    second = json.loads(cli("present", str(log), "4").stdout)
    assert (first["prompt"], first["occurrenceAt"]) == ("water", "2026-12-01T10:00:00.000Z")
    assert (second["prompt"], second["occurrenceAt"]) == (
        "water the plants", "2026-12-01T11:00:00.000Z")
    (view,) = json.loads(cli("fold", str(log), "--now", "2026-12-01T11:20:00Z").stdout)
    assert (view["scheduledAt"], view["deliveredCount"], view["state"]) == (
        "2026-12-01T11:10:00.000Z", 2, "overdue")
    # an update of an ended id is named by check
    bad = write_log(tmp_path / "b.jsonl", [
        {"version": 1, "operation": "create", "schedule": {
            "id": "schedule-1", "kind": "at", "prompt": "x",
            "scheduledAt": "2026-12-01T10:00:00.000Z"}},
        {"version": 1, "operation": "delete", "id": "schedule-1"},
        {"version": 2, "operation": "update", "id": "schedule-1", "prompt": "y"},
    ])
    result = cli("check", str(bad))
    assert result.returncode == 1 and "update of inactive schedule id" in (
        result.stdout + result.stderr)
