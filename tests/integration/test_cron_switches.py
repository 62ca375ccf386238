"""Enabling calendar rules (docs/decisions.md#calendar-rules): ``calendar=True`` on the
plugins and both adapters, ``DSH_SCHEDULE_CALENDAR=on`` for the commands; disabled, every
answer and every tool definition is the one without them, and logs holding calendar
records are read either way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from dsh_schedule.host.aio import AsyncSchedulePlugin
from dsh_schedule.host.plugin import AgentWithTools, SchedulePlugin
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.integrations import langgraph, pydantic_ai
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core import catalog
from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.settings import Settings, SettingsError, calendar_from_env
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.web import model
from dsh_schedule.web.console import Console
from tests.integration.test_cli import cli, write_log
from tests.support import FakeClock
from tests.switched import lifecycle_suite
from tests.web.conftest import web_settings

RULE = {"expression": "0 9 * * MON-FRI", "time_zone": "Europe/Berlin"}


@pytest.mark.parametrize(("value", "on"), [("on", True), ("off", False), ("1", True),
                                           ("no", False), ("", False)])
def test_the_environment_switch(value: str, on: bool) -> None:
    env = {"DSH_SCHEDULE_CALENDAR": value}
    assert Settings.from_env(env).calendar is on
    assert calendar_from_env(env) is on


def test_a_malformed_switch_is_a_clear_error() -> None:
    with pytest.raises(SettingsError, match="calendar must be on or off"):
        Settings.from_env({"DSH_SCHEDULE_CALENDAR": "maybe"})
    with pytest.raises(SettingsError, match="calendar must be on or off"):
        calendar_from_env({"DSH_SCHEDULE_CALENDAR": "maybe"})
    assert Settings.from_env({}).calendar is False


def _tools(settings: Settings, calendar: bool | None) -> tuple[ScheduleTools, JsonlStore]:
    store = JsonlStore(settings.sessions)
    store.create(SessionHeader(id="s1", createdAt=0))
    coordination = Coordination(fakeredis.FakeRedis(), settings)
    return ScheduleTools(store, coordination, settings, FakeClock(), calendar=calendar), store


@pytest.mark.parametrize(("setting", "argument", "on"), [
    (False, None, False), (True, None, True), (False, True, True), (True, False, False)])
def test_the_plugin_argument_overrides_the_setting(
    settings: Settings, setting: bool, argument: bool | None, on: bool,
) -> None:
    switched = Settings.from_env({}, sessions=settings.sessions, prefix=settings.prefix,
                                 calendar=setting)
    coordination = Coordination(fakeredis.FakeRedis(), switched)
    plugin = SchedulePlugin(store=JsonlStore(switched.sessions), coordination=coordination,
                            settings=switched, calendar=argument)
    agent: AgentWithTools[Any] = AgentWithTools("s1")
    plugin._on_agent_created(agent)
    definition = agent.tools["schedule_create"][0]
    assert definition == catalog.tool_definitions(on, switched.lifecycle)[0]
    assert ("cron" in definition.input_schema["properties"]) is on
    plugin.dispose()


def test_disabled_cron_answers_as_before_and_writes_nothing(settings: Settings) -> None:
    tools, store = _tools(settings, None)
    result = tools.call("s1", "schedule_create", {"prompt": "x", "cron": RULE})
    assert result.is_error and result.value["code"] == "invalid_selector"
    assert "DSH_SCHEDULE_CALENDAR=on" in result.value["message"]
    assert store.read("s1").events == ()


def test_enabled_cron_is_recorded_and_listed_and_read_when_disabled_again(
    settings: Settings,
) -> None:
    tools, store = _tools(settings, True)
    made = tools.call("s1", "schedule_create", {"prompt": "stand-up", "cron": RULE})
    assert not made.is_error, made.value
    assert made.value["cron"] == "0 9 * * MON-FRI"
    assert store.read("s1").events[-1].data["version"] == 2
    # a plugin without calendar rules reads the same log: list and delete work
    off = ScheduleTools(store, Coordination(fakeredis.FakeRedis(), settings), settings,
                        FakeClock(), calendar=False)
    assert off.call("s1", "schedule_list", {}).value == [made.value]
    assert off.call("s1", "schedule_delete", {"id": "schedule-1"}).value == {
        "id": "schedule-1", "deleted": True}


@pytest.mark.parametrize("calendar", [False, True])
def test_both_adapters_take_the_plugins_switch(settings: Settings, calendar: bool) -> None:
    plugin = AsyncSchedulePlugin(
        store=JsonlStore(settings.sessions), settings=settings,
        coordination=Coordination(fakeredis.FakeRedis(), settings), calendar=calendar,
    )
    assert plugin.tools.calendar is calendar
    from langchain_core.utils.function_calling import convert_to_openai_tool

    exported = [convert_to_openai_tool(t)["function"]
                for t in langgraph.schedule_tools(plugin, "s1")]
    assert ("cron" in exported[0]["parameters"]["properties"]) is calendar
    offered = catalog.tool_definitions(calendar, settings.lifecycle)
    assert exported[0]["description"] == offered[0].description
    tools = pydantic_ai.schedule_tools(plugin)
    assert tools[0].description == offered[0].description


def test_the_catalog_command_prints_the_variant_the_switch_names() -> None:
    for fmt, export in [("catalog", catalog.catalog_json), ("openai", catalog.openai_tools),
                        ("anthropic", catalog.anthropic_tools)]:
        off = cli("catalog", "--format", fmt)
        on = cli("catalog", "--format", fmt, env={"DSH_SCHEDULE_CALENDAR": "on"})
        lifecycle = lifecycle_suite()  # the lifecycle of this run (tests/switched.py)
        assert json.loads(off.stdout) == export(False, lifecycle)
        assert json.loads(on.stdout) == export(True, lifecycle)
    assert "calendar must be on or off" in cli(
        "catalog", env={"DSH_SCHEDULE_CALENDAR": "maybe"}).stderr


def test_call_with_the_switch(tmp_path: Path) -> None:
    env = {"DSH_SCHEDULE_SESSIONS": str(tmp_path / "sessions")}
    assert cli("session", "create", "s", env=env).returncode == 0
    args = json.dumps({"prompt": "x", "cron": RULE})
    off = cli("call", "s", "schedule_create", args, env=env)
    assert off.returncode == 3 and json.loads(off.stdout)["code"] == "invalid_selector"
    on = cli("call", "s", "schedule_create", args, env={**env, "DSH_SCHEDULE_CALENDAR": "on"})
    assert on.returncode == 0, on.stdout + on.stderr
    assert json.loads(on.stdout)["kind"] == "cron"
    # fold and check read the record whatever the setting
    log = tmp_path / "sessions" / "s.jsonl"
    assert cli("check", str(log)).returncode == 0
    listed = json.loads(cli("fold", str(log)).stdout)
    assert [v["kind"] for v in listed] == ["cron"]


def test_check_and_present_read_a_cron_dispatch(tmp_path: Path) -> None:
    log = write_log(tmp_path / "s.jsonl", [
        {"version": 2, "operation": "create", "schedule": {
            "id": "schedule-1", "kind": "cron", "prompt": "stand-up", "cron": "0 9 * * 1-5",
            "timeZone": "Europe/Berlin", "scheduledAt": "2026-12-02T08:00:00.000Z"}},
        {"version": 1, "operation": "dispatch", "id": "schedule-1",
         "acceptedAt": "2026-12-04T09:00:00.000Z"},
    ])
    assert cli("check", str(log)).returncode == 0
    assert json.loads(cli("present", str(log), "1").stdout)["occurrenceAt"] == (
        "2026-12-04T08:00:00.000Z")
    bad = write_log(tmp_path / "b.jsonl", [
        {"version": 2, "operation": "create", "schedule": {
            "id": "schedule-1", "kind": "every", "prompt": "x", "everySeconds": 300,
            "scheduledAt": "2026-12-02T08:00:00.000Z"}}])
    assert cli("check", str(bad)).returncode == 1


@pytest.mark.parametrize(("text", "named", "cron"), [
    ("every weekday at 09:00 stand-up", "every weekday at 09:00 in Asia/Tokyo stand-up",
     "0 9 * * MON-FRI"),
    ("remind me every monday at 7:30 to plan the week",
     "remind me every monday at 7:30 in Asia/Tokyo to plan the week", "30 7 * * MON"),
    ("every day at 18:05 water the plants", "every day at 18:05 in Asia/Tokyo water the plants",
     "5 18 * * *"),
    ("every weekend at 10:00 call home", "every weekend at 10:00 in Asia/Tokyo call home",
     "0 10 * * SAT,SUN"),
])
def test_the_scripted_model_turns_a_weekday_phrase_into_a_rule(
    text: str, named: str, cron: str,
) -> None:
    planned = model.plan(text, now_ms=0, zone="Europe/Berlin", calendar=True)
    assert [c.args["cron"] for c in planned.calls] == [cron]
    zoned = model.plan(named, now_ms=0, zone="Europe/Berlin", calendar=True)
    assert [c.args["cron"] for c in zoned.calls] == [
        {"expression": cron, "time_zone": "Asia/Tokyo"}]
    # without calendar rules the phrase is what it always was: no rule
    assert "cron" not in json.dumps([c.args for c in model.plan(
        text, now_ms=0, zone="Europe/Berlin").calls])


def test_the_web_console_sets_and_shows_a_weekday_rule(tmp_path: Path) -> None:
    console = Console(web_settings(tmp_path, calendar=True))
    try:
        console.create_session("s", "Europe/Berlin")
        reply = console.prompt("s", "every weekday at 09:00 stand-up", "Europe/Berlin")
        assert "Set schedule-1" in reply and "“0 9 * * MON-FRI” in Europe/Berlin" in reply
        listed = console.prompt("s", "list", "Europe/Berlin")
        assert "0 9 * * MON-FRI" in listed and "next at" in listed
    finally:
        console.stop()
