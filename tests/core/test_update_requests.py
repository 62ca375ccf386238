"""The pure half of ``schedule_update`` (docs/decisions.md#lifecycle-editing-pausing-and-ending-
reminders): its arguments answer create's codes, and every record it builds replays."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_schedule.shared.core.errors import ScheduleLogError, ToolError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, Event
from dsh_schedule.shared.core.fold import fold, fold_events
from dsh_schedule.shared.core.instant import format_instant, parse_instant
from dsh_schedule.shared.core.records import (
    AtSchedule,
    Change,
    DispatchChange,
    EverySchedule,
    Schedule,
    UpdateChange,
    create_change,
    encode_change,
)
from dsh_schedule.shared.core.update_requests import build_update, parse_update_args

T = "2026-12-01T12:00:00.000Z"
NOW = parse_instant(T)
LIMIT = 32 * 1024


def utc() -> str:
    return "UTC"


SHAPE_ERRORS = [
    pytest.param([], "invalid_selector", id="not an object"),
    pytest.param({"id": "schedule-1"}, "invalid_selector", id="no change"),
    pytest.param({"prompt": "x"}, "invalid_selector", id="no id"),
    pytest.param({"id": "schedule-1", "colour": 1}, "invalid_selector", id="an unknown key"),
    pytest.param({"id": "schedule-1", "at": T, "after_seconds": 5}, "invalid_selector",
                 id="two selectors"),
    pytest.param({"id": "schedule-1", "cron": "0 9 * * *"}, "invalid_selector",
                 id="cron without calendar rules"),
    pytest.param({"id": " schedule-1", "paused": True}, "invalid_rule", id="a padded id"),
    pytest.param({"id": "schedule-1", "prompt": "  "}, "invalid_prompt", id="an empty prompt"),
    pytest.param({"id": "schedule-1", "every_seconds": 60}, "frequency_too_high",
                 id="every below 300"),
    pytest.param({"id": "schedule-1", "after_seconds": 0}, "invalid_rule", id="after of zero"),
    pytest.param({"id": "schedule-1", "paused": 1}, "invalid_rule", id="paused not a boolean"),
    pytest.param({"id": "schedule-1", "count": 0}, "invalid_rule", id="count of zero"),
    pytest.param({"id": "schedule-1", "count": True}, "invalid_rule", id="count a boolean"),
]


@pytest.mark.parametrize(("args", "code"), SHAPE_ERRORS)
def test_update_arguments_answer_creates_codes(args: Any, code: str) -> None:
    with pytest.raises(ToolError) as caught:
        parse_update_args(args, max_prompt_bytes=LIMIT)
    assert caught.value.code == code


def log(*changes: Change) -> list[Event]:
    return [Event(type=SCHEDULE_CHANGE, seq=n, time=n, data=encode_change(c))
            for n, c in enumerate(changes)]


EVERY = EverySchedule(id="schedule-1", prompt="check", everySeconds=300, scheduledAt=T)
AT = AtSchedule(id="schedule-1", prompt="call", scheduledAt=T)


def updated(record: Schedule, args: dict[str, Any], now: int = NOW,
            before: tuple[Change, ...] = ()) -> tuple[UpdateChange | None, Schedule | None]:
    """The record an update builds, and the record once it is replayed after ``before``."""
    events = log(create_change(record), *before)
    current = fold(events).active[0]
    request = parse_update_args({"id": "schedule-1", **args}, max_prompt_bytes=LIMIT)
    change = build_update(request, current, now, utc)
    if change is None:
        return None, None
    state = fold_events(fold(events), [Event(type=SCHEDULE_CHANGE, seq=len(events), time=0,
                                             data=encode_change(change))])
    return change, state.active[0]


def test_a_prompt_edit_keeps_the_timing() -> None:
    change, record = updated(EVERY, {"prompt": " new "})
    assert change == UpdateChange(id="schedule-1", prompt="new")
    assert record is not None and record.scheduledAt == T


def test_a_timing_change_keeps_the_id_and_rearms_from_now() -> None:
    change, record = updated(AT, {"every_seconds": 600}, now=NOW + 1000)
    assert change == UpdateChange(id="schedule-1", kind="every", everySeconds=600,
                                  scheduledAt=format_instant(NOW + 601_000))
    assert record is not None and (record.id, record.kind) == ("schedule-1", "every")


def test_an_update_that_changes_nothing_builds_nothing() -> None:
    assert updated(EVERY, {"prompt": "check"}) == (None, None)
    assert updated(AT, {"paused": False}) == (None, None)


def test_a_resume_moves_a_passed_recurring_target_to_the_next_aligned_one() -> None:
    paused = (UpdateChange(id="schedule-1", paused=True),)
    change, record = updated(EVERY, {"paused": False}, now=NOW + 700_000, before=paused)
    assert change == UpdateChange(id="schedule-1", paused=False,
                                  scheduledAt=format_instant(NOW + 900_000))
    assert record is not None and not record.paused


def test_end_conditions_resolve_as_at_and_replay() -> None:
    change, record = updated(EVERY, {"until": "2026-12-01T13:00:00Z", "count": 4})
    assert change == UpdateChange(id="schedule-1", until="2026-12-01T13:00:00.000Z", count=4)
    assert record is not None and getattr(record, "count", None) == 4


END_ERRORS = [
    pytest.param(AT, {"count": 2}, "invalid_rule", id="an end condition on a one-shot"),
    pytest.param(EVERY, {"until": "2026-12-01T11:59:00Z"}, "not_future", id="until in the past"),
    pytest.param(EverySchedule(id="schedule-1", prompt="p", everySeconds=300,
                               scheduledAt=format_instant(NOW + 3_600_000)),
                 {"until": "2026-12-01T12:30:00Z"}, "invalid_rule", id="until before the target"),
    pytest.param(EVERY, {"after_seconds": 60, "count": 2}, "invalid_rule",
                 id="a one-shot timing with count"),
    pytest.param(EverySchedule(id="schedule-1", prompt="p", everySeconds=600, scheduledAt=T,
                               until="2026-12-01T12:30:00.000Z"),
                 {"every_seconds": 3600}, "invalid_rule", id="a new target past until"),
]


@pytest.mark.parametrize(("record", "args", "code"), END_ERRORS)
def test_end_conditions_that_cannot_hold_are_refused(record: Schedule, args: dict[str, Any],
                                                     code: str) -> None:
    with pytest.raises(ToolError) as caught:
        updated(record, args)
    assert caught.value.code == code


ARGS = st.fixed_dictionaries({}, optional={
    "prompt": st.sampled_from(["check", "new", " x "]),
    "after_seconds": st.integers(1, 4000),
    "every_seconds": st.sampled_from([300, 600, 900]),
    "at": st.sampled_from(["2026-12-01T12:30:00Z", "2026-12-01T11:00:00Z"]),
    "paused": st.booleans(),
    "until": st.sampled_from(["2026-12-01T12:20:00Z", "2026-12-01T14:00:00Z"]),
    "count": st.integers(1, 4),
})
RECORDS = st.sampled_from([
    EVERY, AT, EverySchedule(id="schedule-1", prompt="p", everySeconds=600, scheduledAt=T,
                             count=3, until="2026-12-01T13:00:00.000Z"),
])


@settings(max_examples=500, deadline=None)
@given(RECORDS, ARGS, st.booleans(), st.integers(0, 3),
       st.sampled_from([0, 700_000, 3_000_000]))
def test_every_update_the_request_builds_replays(record: Schedule, args: dict[str, Any],
                                                 pause: bool, dispatches: int, later: int) -> None:
    """Whatever it is asked, the tool's half answers a code, builds nothing, or builds a
    record replay accepts: it never writes what a fold would reject."""
    before: list[Change] = []
    at_ms = NOW
    for n in range(dispatches if isinstance(record, EverySchedule) else 0):
        before.append(DispatchChange(id="schedule-1", acceptedAt=format_instant(at_ms)))
        at_ms = NOW + (n + 1) * record.everySeconds * 1000
    if pause:
        before.append(UpdateChange(id="schedule-1", paused=True))
    try:
        ended = not fold(log(create_change(record), *before)).active
    except ScheduleLogError:
        ended = True
    if ended:
        return  # the record ended before the update: the tool answers not found
    keys = [k for k in ("after_seconds", "every_seconds", "at") if k in args]
    for extra in keys[1:]:
        del args[extra]
    if not args:
        return
    try:
        updated(record, args, now=NOW + later, before=tuple(before))
    except ToolError:
        pass


def test_an_edit_that_would_overflow_the_recurring_batch_answers_as_create_does() -> None:
    """The session's recurring prompts together stay within one delivery line."""
    other = EverySchedule(id="schedule-2", prompt="x" * 300, everySeconds=300, scheduledAt=T)
    request = parse_update_args({"id": "schedule-1", "prompt": "y" * 300},
                                max_prompt_bytes=LIMIT)
    with pytest.raises(ToolError) as caught:
        build_update(request, EVERY, NOW, utc, active=(EVERY, other), line_bytes=9000)
    assert caught.value.code == "invalid_prompt"
    assert build_update(request, AT, NOW, utc, active=(AT, other), line_bytes=9000) is not None
