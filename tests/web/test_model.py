"""The web console's scripted model: which tool calls a prompt becomes, and its answers."""

from __future__ import annotations

from typing import Any

import pytest

from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.web.model import HELP, Answered, ToolCall, answer, local_text, plan

# 2026-12-01 10:30:00 in Berlin (UTC+1 in December), 17:30 in Shanghai.
NOW = parse_instant("2026-12-01T09:30:00.000Z")


def calls(text: str, zone: str | None = "Europe/Berlin") -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.args) for c in plan(text, now_ms=NOW, zone=zone).calls]


@pytest.mark.parametrize(("text", "expected"), [
    ("remind me in 30 seconds to stretch", {"prompt": "stretch", "after_seconds": 30}),
    ("in 5 minutes stand up", {"prompt": "stand up", "after_seconds": 300}),
    ("Remind me in 2 hours to call mum", {"prompt": "call mum", "after_seconds": 7200}),
    ("remind me in an hour to eat", {"prompt": "eat", "after_seconds": 3600}),
    ("remind me to water the plants in 10 min",
     {"prompt": "water the plants", "after_seconds": 600}),
    ("remind me in 3s to  look   up", {"prompt": "look up", "after_seconds": 3}),
    ("every 5 minutes check the build", {"prompt": "check the build", "every_seconds": 300}),
    ("every hour stretch", {"prompt": "stretch", "every_seconds": 3600}),
    ("every 30 seconds spam", {"prompt": "spam", "every_seconds": 30}),
])
def test_relative_and_recurring_prompts(text: str, expected: dict[str, Any]) -> None:
    assert calls(text) == [("schedule_create", expected)]


@pytest.mark.parametrize(("text", "zone", "at"), [
    # 17:00 is still ahead today in Berlin (10:30 now).
    ("at 17:00 call the office", "Europe/Berlin", {"date": "2026-12-01", "time": "17:00:00"}),
    # 09:00 has passed in Berlin: the next one is tomorrow.
    ("at 9:00 call the office", "Europe/Berlin", {"date": "2026-12-02", "time": "09:00:00"}),
    # In Shanghai it is 17:30 already: 17:00 is tomorrow there.
    ("at 17:00 call the office", "Asia/Shanghai", {"date": "2026-12-02", "time": "17:00:00"}),
    ("at 17:00:30 tomorrow call", "Europe/Berlin", {"date": "2026-12-02", "time": "17:00:30"}),
    ("at 08:00 today call", "Europe/Berlin", {"date": "2026-12-01", "time": "08:00:00"}),
    ("at 08:00 on 2027-01-05 call", "Europe/Berlin", {"date": "2027-01-05", "time": "08:00:00"}),
    # A named zone is passed to the tool, and it picks the date too.
    ("at 17:00 in Asia/Shanghai call the office", "Europe/Berlin",
     {"date": "2026-12-02", "time": "17:00:00", "time_zone": "Asia/Shanghai"}),
    # Not a zone: part of the prompt.
    ("at 17:00 in the lobby meet Sam", "Europe/Berlin",
     {"date": "2026-12-01", "time": "17:00:00"}),
    # An impossible time goes to the tool as written; the tool says what is wrong.
    ("at 25:00 call", "Europe/Berlin", {"date": "2026-12-01", "time": "25:00:00"}),
])
def test_local_times(text: str, zone: str, at: dict[str, str]) -> None:
    [(name, args)] = calls(text, zone)
    assert name == "schedule_create"
    assert args["at"] == at


def test_a_prompt_after_a_phrase_that_is_no_zone_keeps_it() -> None:
    [(_name, args)] = calls("at 17:00 in the lobby meet Sam")
    assert args["prompt"] == "in the lobby meet Sam"


def test_list_delete_and_anything_else() -> None:
    assert calls("list") == [("schedule_list", {})]
    assert calls("List reminders") == [("schedule_list", {})]
    assert calls("delete schedule-2") == [("schedule_delete", {"id": "schedule-2"})]
    assert calls("cancel schedule-10") == [("schedule_delete", {"id": "schedule-10"})]
    for text in ("<img src=x onerror=alert(1)>", "hello", "", "   ", "remind me"):
        result = plan(text, now_ms=NOW, zone="UTC")
        assert result.calls == ()
        assert result.reply == HELP


def test_answers() -> None:
    created = Answered(
        call=ToolCall("schedule_create", {}), is_error=False,
        value={"id": "schedule-1", "kind": "after", "prompt": "stretch", "afterSeconds": 30,
               "scheduledAt": "2026-12-01T09:30:30.000Z", "state": "scheduled"},
    )
    assert answer([created], zone="Europe/Berlin") == (
        "Set schedule-1: “stretch” in 30 s, at 2026-12-01 10:30:30 Europe/Berlin.")
    confirm = Answered(
        call=ToolCall("schedule_create", {}), is_error=True,
        value={"code": "timezone_confirmation_required", "message": "Which zone?",
               "sessionTimeZone": "Asia/Shanghai", "clientTimeZones": ["America/New_York"]},
    )
    text = answer([confirm], zone="Asia/Shanghai")
    assert text.startswith("schedule_create answered timezone_confirmation_required: Which zone?")
    assert "America/New_York" in text and "“at 17:00 in Asia/Shanghai call the office”" in text
    listed = Answered(call=ToolCall("schedule_list", {}), is_error=False, value=[])
    assert answer([listed], zone=None) == "No active reminders."
    gone = Answered(call=ToolCall("schedule_delete", {}), is_error=False,
                    value={"id": "schedule-9", "deleted": False, "code": "schedule_not_found"})
    assert answer([gone], zone=None) == "schedule-9 is not an active reminder (schedule_not_found)."


def test_local_text_falls_back_to_utc_for_a_zone_it_cannot_use() -> None:
    assert local_text(NOW, "Asia/Shanghai") == "2026-12-01 17:30:00 Asia/Shanghai"
    assert local_text(NOW, "Mars/Base") == "2026-12-01 09:30:00 UTC"
    assert local_text(NOW, None) == "2026-12-01 09:30:00 UTC"


def test_pause_and_resume_are_calls_only_with_the_lifecycle_on() -> None:
    assert plan("pause schedule-2", now_ms=NOW, zone="UTC", lifecycle=True).calls == (
        ToolCall("schedule_update", {"id": "schedule-2", "paused": True}),)
    assert plan("Resume schedule-2", now_ms=NOW, zone="UTC", lifecycle=True).calls == (
        ToolCall("schedule_update", {"id": "schedule-2", "paused": False}),)
    off = plan("pause schedule-2", now_ms=NOW, zone="UTC")
    assert (off.calls, off.reply) == ((), HELP)


def test_answers_of_an_update() -> None:
    view = {"id": "schedule-3", "kind": "every", "prompt": "water", "everySeconds": 600,
            "scheduledAt": "2026-12-01T09:40:00.000Z", "state": "paused", "count": 3,
            "deliveredCount": 1, "until": "2026-12-02T09:00:00.000Z"}
    paused = Answered(call=ToolCall("schedule_update", {"id": "schedule-3", "paused": True}),
                      is_error=False, value=view)
    assert answer([paused], zone="UTC") == (
        "Paused schedule-3: “water” every 600 s, next at 2026-12-01 09:40:00 UTC, 3 times "
        "(1 delivered), until 2026-12-02 09:00:00 UTC, paused.")
    resumed = Answered(call=ToolCall("schedule_update", {"id": "schedule-3", "paused": False}),
                       is_error=False, value={**view, "state": "scheduled"})
    assert answer([resumed], zone="UTC").startswith("Resumed schedule-3: “water” every 600 s")
    edited = Answered(call=ToolCall("schedule_update", {"id": "schedule-3", "prompt": "water"}),
                      is_error=False, value={**view, "state": "scheduled"})
    assert answer([edited], zone="UTC").startswith("Updated schedule-3: “water”")
    gone = Answered(call=ToolCall("schedule_update", {"id": "schedule-9", "paused": True}),
                    is_error=False,
                    value={"id": "schedule-9", "updated": False, "code": "schedule_not_found"})
    assert answer([gone], zone=None) == "schedule-9 is not an active reminder (schedule_not_found)."
