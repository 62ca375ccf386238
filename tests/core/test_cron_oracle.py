"""The evaluator against an independent brute-force oracle (docs/decisions.md#calendar-rules).

The oracle applies the occurrence rules literally: it walks every local minute of a
window, asks ``zoneinfo`` which instants show that wall-clock time (converting instants to
local time only), and takes the one instant, the earlier of two, or — for a time no
instant shows — the end of the gap, found from the zone's offset transitions. Transitions
are found by sampling the offset every six hours over fifteen years and bisecting to the
second. It shares nothing with the evaluator but the parsed field sets.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from functools import cache
from typing import NamedTuple
from zoneinfo import ZoneInfo

import pytest

from dsh_schedule.shared.core.cron import CronRule, parse_rule
from dsh_schedule.shared.core.cron_occurrences import latest_at_or_before, next_after
from dsh_schedule.shared.core.timesel import load_zone

pytestmark = pytest.mark.slow

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FROM = datetime(2015, 1, 1, tzinfo=UTC)
TO = datetime(2030, 1, 1, tzinfo=UTC)
MINUTE_MS = 60_000
HOUR_MS = 3_600_000
SAMPLE_S = 6 * 3600

ZONES = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Africa/Casablanca",
    "America/Santiago",
    "Asia/Tehran",
    "Pacific/Apia",
    "Europe/Dublin",
    "Europe/London",
    "Europe/Lisbon",
    "Europe/Kyiv",
    "Europe/Istanbul",
    "Europe/Volgograd",
    "America/Havana",
    "America/Asuncion",
    "America/Sao_Paulo",
    "America/Mexico_City",
    "America/St_Johns",
    "America/Nuuk",
    "America/Caracas",
    "America/Los_Angeles",
    "Asia/Gaza",
    "Asia/Beirut",
    "Asia/Amman",
    "Asia/Damascus",
    "Asia/Pyongyang",
    "Pacific/Auckland",
    "Pacific/Chatham",
    "Pacific/Norfolk",
    "Pacific/Fiji",
    "Australia/Adelaide",
    "Antarctica/Troll",
    "Africa/Cairo",
    "Africa/Juba",
    "America/Whitehorse",
]

# Rules aimed at every place a transition can fall: wildcard hours, fixed times across the
# small hours, steps, lists, weekdays (most changes fall on a Sunday) and the day OR rule.
TRANSITION_RULES = [
    "*/5 * * * *",
    "0 * * * *",
    "30 * * * *",
    "15,45 * * * *",
    "*/30 0-4 * * *",
    "0 0 * * *",
    "30 0 * * *",
    "0 1 * * *",
    "30 1 * * *",
    "59 1 * * *",
    "0 2 * * *",
    "30 2 * * *",
    "45 2 * * *",
    "0 3 * * *",
    "30 3 * * *",
    "0 23 * * *",
    "59 23 * * *",
    "7,37 */2 * * *",
    "*/10 * * * 0",
    "*/20 * * * 1-6",
    "0-50/10 0-3 1-7,25-31 * *",
    "30 2 * * SUN",
    "0 2 1 * 0",
    "*/15 1-3 * 3,4,9,10,11 *",
    "5 0-6/2 * * FRI-7",
    "0 12 29 2 *",
    "0 0 31 * *",
]

# Rules about days, walked over every day of the fifteen years at noon.
DAY_RULES = [
    "0 12 29 2 *",
    "0 12 31 * *",
    "0 12 30 * *",
    "0 12 1,15 * 5",
    "0 12 13 * 5",
    "0 12 */2 * 1-5",
    "0 12 * * 1/2",
    "0 12 29 2 1",
    "0 12 * 2 */3",
    "0 12 1-7 * 1",
    "0 12 */7 * 1",
    "0 12 31 1,3,5 SAT-7",
    "0 12 28-31 2 *",
    "0 12 * * 0",
    "0 12 1 */3 *",
]


class Transition(NamedTuple):
    instant_ms: int
    before_ms: int  # offset east of UTC before it
    after_ms: int


def offset_ms(zone: ZoneInfo, instant_ms: int) -> int:
    local = (EPOCH + timedelta(milliseconds=instant_ms)).astimezone(zone)
    offset = local.utcoffset()
    assert offset is not None
    return offset // timedelta(milliseconds=1)


def reading_ms(zone: ZoneInfo, instant_ms: int) -> int:
    """The wall-clock reading of an instant, in milliseconds since 1970-01-01 local."""
    return instant_ms + offset_ms(zone, instant_ms)


@cache
def transitions(zone_name: str) -> tuple[Transition, ...]:
    zone = ZoneInfo(zone_name)
    found = []
    start, stop = int(FROM.timestamp()), int(TO.timestamp())
    previous = offset_ms(zone, start * 1000)
    for second in range(start + SAMPLE_S, stop + 1, SAMPLE_S):
        current = offset_ms(zone, second * 1000)
        if current == previous:
            continue
        low, high = second - SAMPLE_S, second  # offset(low) == previous, offset(high) != it
        while high - low > 1:
            middle = (low + high) // 2
            if offset_ms(zone, middle * 1000) == previous:
                low = middle
            else:
                high = middle
        found.append(Transition(high * 1000, previous, offset_ms(zone, high * 1000)))
        previous = current
    return tuple(found)


def oracle_day_matches(rule: CronRule, day: date) -> bool:
    """The day rule, literally: either field when both are restricted, else both."""
    weekday = day.isoweekday() % 7  # Sunday 0
    on_day, on_weekday = day.day in rule.days, weekday in rule.weekdays
    return (on_day or on_weekday) if rule.either_day else (on_day and on_weekday)


def wall_minutes(first_ms: int, last_ms: int) -> Iterator[int]:
    minute = -(-first_ms // MINUTE_MS)
    while minute * MINUTE_MS <= last_ms:
        yield minute * MINUTE_MS
        minute += 1


class Place(NamedTuple):
    """Where one wall minute lies: its calendar fields and the occurrence it would give."""

    wall_ms: int
    day: date
    minute_of_day: int
    occurrence_ms: int


def places(zone: ZoneInfo, zone_name: str, start_ms: int, end_ms: int) -> list[Place]:
    """Every local minute whose occurrence could fall in ``[start_ms, end_ms]``, placed."""
    nearby = [
        t
        for t in transitions(zone_name)
        if start_ms - 2 * 86_400_000 <= t.instant_ms <= end_ms + 2 * 86_400_000
    ]
    offsets = (
        {offset_ms(zone, start_ms)} | {t.before_ms for t in nearby} | {t.after_ms for t in nearby}
    )
    margin = max(abs(o) for o in offsets) + 2 * HOUR_MS
    result = []
    for wall in wall_minutes(start_ms - margin, end_ms + margin):
        shown = sorted(wall - o for o in offsets if reading_ms(zone, wall - o) == wall)
        if shown:
            occurrence = shown[0]  # exists once, or twice: the earlier instant
        else:
            gaps = [
                t
                for t in nearby
                if t.before_ms < t.after_ms
                and t.instant_ms + t.before_ms <= wall < t.instant_ms + t.after_ms
            ]
            assert len(gaps) == 1, f"{zone_name}: {wall} shows on no instant and in no gap"
            occurrence = gaps[0].instant_ms  # the instant the gap ends
        day_number, millis = divmod(wall, 86_400_000)
        result.append(
            Place(
                wall,
                date.fromordinal(date(1970, 1, 1).toordinal() + day_number),
                millis // MINUTE_MS,
                occurrence,
            )
        )
    return result


def oracle(rule: CronRule, window: list[Place], start_ms: int, end_ms: int) -> list[int]:
    """The rule's occurrences in ``(start_ms, end_ms]``, strictly increasing."""
    times = {hour * 60 + minute for hour in rule.hours for minute in rule.minutes}
    occurrences = {
        place.occurrence_ms
        for place in window
        if place.day.month in rule.months
        and place.minute_of_day in times
        and oracle_day_matches(rule, place.day)
    }
    return sorted(o for o in occurrences if start_ms < o <= end_ms)


def evaluated(rule: CronRule, zone: ZoneInfo, start_ms: int, end_ms: int) -> list[int]:
    result, instant = [], start_ms
    while (following := next_after(rule, zone, instant)) is not None and following <= end_ms:
        assert following > instant
        result.append(following)
        instant = following
    return result


def compare(
    rule: CronRule,
    zone: ZoneInfo,
    expected: list[int],
    start_ms: int,
    end_ms: int,
    probes: list[int],
) -> list[str]:
    """Differences between the evaluator and the oracle's list, as readable lines."""
    differences = []
    got = evaluated(rule, zone, start_ms, end_ms)
    if got != expected:
        differences.append(f"{rule.expression}: next_after chain {got} != oracle {expected}")
    for probe in probes:
        if not start_ms <= probe <= end_ms:
            continue
        index = bisect.bisect_right(expected, probe)
        latest = latest_at_or_before(rule, zone, probe)
        if index:
            if latest != expected[index - 1]:
                differences.append(
                    f"{rule.expression}: latest({probe}) {latest} != {expected[index - 1]}"
                )
        elif latest is not None and latest > start_ms:
            differences.append(
                f"{rule.expression}: latest({probe}) {latest} is in the window "
                "but the oracle has none"
            )
        following = next_after(rule, zone, probe)
        if index < len(expected) and following != expected[index]:
            differences.append(f"{rule.expression}: next({probe}) {following} != {expected[index]}")
    return differences


def test_the_oracle_finds_the_transitions_it_claims() -> None:
    """The oracle's own footing: known changes are found to the second."""
    berlin = transitions("Europe/Berlin")
    assert Transition(1490490000000, 3_600_000, 7_200_000) in berlin  # 2017-03-26 01:00Z
    assert Transition(1509238800000, 7_200_000, 3_600_000) in berlin  # 2017-10-29 01:00Z
    lord_howe = transitions("Australia/Lord_Howe")
    assert {abs(t.after_ms - t.before_ms) for t in lord_howe} == {1_800_000}
    assert len(transitions("Asia/Tokyo")) == 0
    assert sum(len(transitions(name)) > 0 for name in ZONES) >= 30


@pytest.mark.parametrize("zone_name", ZONES)
def test_every_transition_of_fifteen_years_matches_the_oracle(zone_name: str) -> None:
    zone = load_zone(zone_name)
    rules = [parse_rule(text) for text in TRANSITION_RULES]
    differences: list[str] = []
    for change in transitions(zone_name):
        jump = abs(change.after_ms - change.before_ms)
        start_ms = change.instant_ms - 4 * HOUR_MS - jump
        end_ms = change.instant_ms + 4 * HOUR_MS + jump
        window = places(zone, zone_name, start_ms, end_ms)
        for rule in rules:
            expected = oracle(rule, window, start_ms, end_ms)
            probes = [
                start_ms,
                end_ms,
                change.instant_ms - 1,
                change.instant_ms,
                change.instant_ms + 1,
                change.instant_ms + jump // 2,
            ]
            probes += [p + d for p in expected for d in (-1, 0, 1)]
            differences += compare(rule, zone, expected, start_ms, end_ms, probes)
    assert differences == []


@pytest.mark.parametrize(
    ("zone_name", "month"),
    [
        ("Europe/Berlin", (2028, 2)),
        ("Europe/Berlin", (2027, 3)),
        ("Europe/Berlin", (2027, 10)),
        ("America/New_York", (2027, 11)),
        ("Australia/Lord_Howe", (2027, 4)),
        ("America/Santiago", (2027, 9)),
        ("UTC", (2027, 12)),
    ],
)
def test_whole_months_minute_by_minute_match_the_oracle(
    zone_name: str, month: tuple[int, int]
) -> None:
    zone = load_zone(zone_name)
    year, number = month
    start = datetime(year, number, 1, tzinfo=UTC)
    stop = datetime(year + number // 12, number % 12 + 1, 1, tzinfo=UTC)
    start_ms, end_ms = int(start.timestamp() * 1000), int(stop.timestamp() * 1000)
    window = places(zone, zone_name, start_ms, end_ms)
    differences: list[str] = []
    for text in TRANSITION_RULES + DAY_RULES:
        rule = parse_rule(text)
        expected = oracle(rule, window, start_ms, end_ms)
        probes = [start_ms + i * 3_456_789 for i in range(0, (end_ms - start_ms) // 3_456_789)]
        differences += compare(rule, zone, expected, start_ms, end_ms, probes)
    assert differences == []


@pytest.mark.parametrize("zone_name", ["UTC", "Europe/Berlin", "Pacific/Chatham"])
@pytest.mark.parametrize("text", DAY_RULES)
def test_every_day_of_fifteen_years_matches_the_day_rule(zone_name: str, text: str) -> None:
    """Feb 29, month ends and the day OR rule, day by day; noon exists once in these zones."""
    zone, rule = load_zone(zone_name), parse_rule(text)
    start_ms, end_ms = int(FROM.timestamp() * 1000), int(TO.timestamp() * 1000)
    expected = []
    day = FROM.date()
    while day <= TO.date():
        if day.month in rule.months and oracle_day_matches(rule, day):
            noon = datetime(day.year, day.month, day.day, 12, tzinfo=zone)
            expected.append(int(noon.timestamp() * 1000))
        day += timedelta(days=1)
    expected = [o for o in expected if start_ms < o <= end_ms]
    assert expected
    assert evaluated(rule, zone, start_ms, end_ms) == expected
