"""The worked examples of docs/decisions.md#calendar-rules, one row each, and the order in
which a ``cron`` selector is checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dsh_schedule.shared.core.cron import parse_rule
from dsh_schedule.shared.core.cron_occurrences import latest_at_or_before, next_after, resolve_cron
from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.instant import format_instant, parse_instant
from dsh_schedule.shared.core.timesel import load_zone


def chain(expression: str, zone_name: str, start: str, count: int) -> list[str]:
    rule, zone = parse_rule(expression), load_zone(zone_name)
    instant, found = parse_instant(start), []
    for _ in range(count):
        following = next_after(rule, zone, instant)
        assert following is not None
        found.append(format_instant(following)[:16] + "Z")
        instant = following
    return found


EXAMPLES = [
    (
        "02:30 daily on the spring change is the gap's end, 03:00 CEST",
        "30 2 * * *",
        "Europe/Berlin",
        "2027-03-27T00:00:00.000Z",
        ["2027-03-27T01:30Z", "2027-03-28T01:00Z", "2027-03-29T00:30Z"],
    ),
    (
        "02:30 daily on the autumn change is only the first 02:30",
        "30 2 * * *",
        "Europe/Berlin",
        "2027-10-30T00:00:00.000Z",
        ["2027-10-30T00:30Z", "2027-10-31T00:30Z", "2027-11-01T01:30Z"],
    ),
    (
        "a time in Lord Howe's 30-minute gap is the gap's end, 02:30 +11:00",
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2027-10-01T12:00:00.000Z",
        ["2027-10-01T15:45Z", "2027-10-02T15:30Z", "2027-10-03T15:15Z"],
    ),
    (
        "a time in Lord Howe's 30-minute overlap is its earlier instant",
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2027-04-02T12:00:00.000Z",
        ["2027-04-02T14:45Z", "2027-04-03T14:45Z", "2027-04-04T15:15Z"],
    ),
    (
        "every time in one gap collapses into one occurrence",
        "*/15 2 * * *",
        "Europe/Berlin",
        "2027-03-27T12:00:00.000Z",
        ["2027-03-28T01:00Z", "2027-03-29T00:00Z", "2027-03-29T00:15Z"],
    ),
    (
        "a matching time at the gap's end collapses with the gap's",
        "0,30 2,3 * * *",
        "Europe/Berlin",
        "2027-03-27T12:00:00.000Z",
        ["2027-03-28T01:00Z", "2027-03-28T01:30Z", "2027-03-29T00:00Z"],
    ),
    (
        "midnight skipped in Santiago is 01:00 -03:00",
        "0 0 * * *",
        "America/Santiago",
        "2027-09-03T00:00:00.000Z",
        ["2027-09-03T04:00Z", "2027-09-04T04:00Z", "2027-09-05T04:00Z", "2027-09-06T03:00Z"],
    ),
    (
        "occurrences can be closer than 5 minutes at a gap's end",
        "2,57 * * * *",
        "Europe/Berlin",
        "2027-03-28T00:30:00.000Z",
        ["2027-03-28T00:57Z", "2027-03-28T01:00Z", "2027-03-28T01:02Z"],
    ),
]


@pytest.mark.parametrize(
    ("expression", "zone", "start", "expected"),
    [row[1:] for row in EXAMPLES],
    ids=[row[0] for row in EXAMPLES],
)
def test_a_worked_example(expression: str, zone: str, start: str, expected: list[str]) -> None:
    assert chain(expression, zone, start, len(expected)) == expected


def test_catch_up_on_the_second_pass_delivers_the_first_and_only_0230() -> None:
    rule, zone = parse_rule("30 2 * * *"), load_zone("Europe/Berlin")
    accepted = parse_instant("2027-10-31T01:40:00.000Z")  # 02:40 +01:00, after the change
    assert latest_at_or_before(rule, zone, accepted) == parse_instant("2027-10-31T00:30:00.000Z")
    assert next_after(rule, zone, accepted) == parse_instant("2027-11-01T01:30:00.000Z")


def no_zone() -> str:
    raise ToolError("timezone_confirmation_required")


def berlin() -> str:
    return "Europe/Berlin"


NOW = "2027-03-26T12:00:00.000Z"  # a Friday

RESOLVED = [
    (
        "an explicit zone",
        {"expression": "0 9 * * MON-FRI", "time_zone": "America/New_York"},
        no_zone,
        "America/New_York",
        "2027-03-26T13:00:00.000Z",
    ),
    (
        "a string takes the context's zone",
        "0 9 * * MON-FRI",
        berlin,
        "Europe/Berlin",
        "2027-03-29T07:00:00.000Z",
    ),
    (
        "an object without time_zone takes the context's zone",
        {"expression": "0 9 * * 1-5"},
        berlin,
        "Europe/Berlin",
        "2027-03-29T07:00:00.000Z",
    ),
    (
        "UTC is a zone",
        {"expression": "0 13 * * *", "time_zone": "UTC"},
        no_zone,
        "UTC",
        "2027-03-26T13:00:00.000Z",
    ),
]


@pytest.mark.parametrize(
    ("value", "context", "zone", "expected"),
    [row[1:] for row in RESOLVED],
    ids=[row[0] for row in RESOLVED],
)
def test_a_cron_selector_resolves_to_its_zone_and_first_target(
    value: Any, context: Callable[[], str], zone: str, expected: str
) -> None:
    target = resolve_cron(value, now_ms=parse_instant(NOW), implicit_zone=context)
    assert (target.time_zone, format_instant(target.scheduled_at_ms)) == (zone, expected)
    assert target.rule == parse_rule(value if isinstance(value, str) else value["expression"])


REFUSED = [
    ("grammar before the missing zone", "0 9 * * L", no_zone, "invalid_rule"),
    ("frequency before the missing zone", "*/4 * * * *", no_zone, "frequency_too_high"),
    (
        "frequency before a bad zone",
        {"expression": "0,3 9 * * *", "time_zone": "Nowhere/Else"},
        no_zone,
        "frequency_too_high",
    ),
    ("a string without a confirmed zone", "0 9 * * *", no_zone, "timezone_confirmation_required"),
    (
        "a zone that is not Area/Location",
        {"expression": "0 9 * * *", "time_zone": "Etc/GMT+5"},
        no_zone,
        "invalid_time_zone",
    ),
    ("an empty zone", {"expression": "0 9 * * *", "time_zone": ""}, no_zone, "invalid_time_zone"),
    (
        "the zone before the ten years",
        {"expression": "0 0 30 2 *", "time_zone": "Mars/Base"},
        no_zone,
        "invalid_time_zone",
    ),
    (
        "no occurrence in ten years",
        {"expression": "0 0 30 2 *", "time_zone": "UTC"},
        no_zone,
        "invalid_rule",
    ),
]


@pytest.mark.parametrize(
    ("value", "context", "expected"), [row[1:] for row in REFUSED], ids=[row[0] for row in REFUSED]
)
def test_a_cron_selector_is_refused_with_the_first_applicable_code(
    value: Any, context: Callable[[], str], expected: str
) -> None:
    with pytest.raises(ToolError) as caught:
        resolve_cron(value, now_ms=parse_instant(NOW), implicit_zone=context)
    assert caught.value.code == expected
