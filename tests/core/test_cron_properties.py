"""Properties of the calendar-rule evaluator (docs/decisions.md#calendar-rules), and a
differential run against croniter where the two agree: UTC, and the shared grammar."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dsh_schedule.shared.core.cron import CronRule, parse_rule
from dsh_schedule.shared.core.cron_occurrences import (
    TEN_YEARS_MS,
    first_occurrence,
    latest_at_or_before,
    next_after,
)
from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.instant import MAX_MS, MIN_MS, parse_instant
from dsh_schedule.shared.core.timesel import load_zone

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MS = timedelta(milliseconds=1)
ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Africa/Casablanca",
    "America/Santiago",
    "Asia/Tehran",
    "Pacific/Apia",
    "Europe/Dublin",
    "Pacific/Chatham",
    "America/St_Johns",
    "Asia/Kolkata",
]
MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
WEEKDAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]

HISTORIC_ZONES = [
    "Europe/Amsterdam",
    "Europe/Dublin",
    "Asia/Kolkata",
    "America/Detroit",
    "Africa/Monrovia",
    "Pacific/Kiritimati",
    "Pacific/Apia",
    "America/Sitka",
    "Europe/Moscow",
    "Asia/Shanghai",
]
historic_instants = st.integers(
    parse_instant("1850-01-01T00:00:00.000Z"), parse_instant("2100-01-01T00:00:00.000Z")
)
instants = st.integers(
    parse_instant("2000-01-01T00:00:00.000Z"), parse_instant("2040-01-01T00:00:00.000Z")
)


def padded(value: int) -> st.SearchStrategy[str]:
    return st.sampled_from([str(value), f"{value:02d}", f"{value:03d}"])


@st.composite
def minute_field(draw: st.DrawFn, strict_ranges: bool = False) -> str:
    """Minutes all alike modulo 5, so the times of a day are never under 5 minutes apart."""
    shift = draw(st.integers(0, 4))
    form = draw(st.sampled_from(["list", "step", "from", "range"]))
    if form == "step":
        return f"*/{draw(st.sampled_from([5, 10, 15, 20, 30, 60]))}" if shift == 0 else str(shift)
    if form == "from":
        return f"{shift + 5 * draw(st.integers(0, 11))}/{5 * draw(st.integers(1, 12))}"
    if form == "range":
        low = draw(st.integers(0, 10 if strict_ranges else 11))
        high = draw(st.integers(low + 1 if strict_ranges else low, 11))
        return f"{shift + 5 * low}-{shift + 5 * high}/{5 * draw(st.integers(1, 4))}"
    values = draw(st.sets(st.integers(0, 11), min_size=1, max_size=4))
    return ",".join(draw(padded(shift + 5 * v)) for v in sorted(values))


@st.composite
def general_field(
    draw: st.DrawFn,
    low: int,
    high: int,
    names: list[str] | None = None,
    star_steps: bool = True,
    strict_ranges: bool = False,
) -> str:
    """A field of the grammar; ``strict_ranges`` leaves out ranges of one value (croniter
    reads ``10-10`` in the month as every month)."""

    def atom(value: int) -> str:
        if names is not None and value - low < len(names) and draw(st.booleans()):
            spelled = names[value - low]
            return draw(st.sampled_from([spelled, spelled.lower(), spelled.title()]))
        return draw(padded(value))

    def item() -> str:
        form = draw(st.sampled_from(["star", "value", "range", "step"]))
        if form == "star":
            return (
                "*/" + str(draw(st.integers(1, high)))
                if star_steps and draw(st.booleans())
                else "*"
            )
        first = draw(st.integers(low, high))
        if form == "value":
            return atom(first)
        if strict_ranges and first == high:
            return atom(first)
        last = draw(st.integers(first + 1 if strict_ranges else first, high))
        if form == "range":
            return f"{atom(first)}-{atom(last)}"
        return f"{atom(first)}-{atom(last)}/{draw(st.integers(1, high))}"

    return ",".join(item() for _ in range(draw(st.integers(1, 3))))


@st.composite
def rules(draw: st.DrawFn) -> CronRule:
    text = " ".join(
        [
            draw(minute_field()),
            draw(general_field(0, 23)),
            draw(general_field(1, 31)),
            draw(general_field(1, 12, MONTHS)),
            draw(general_field(0, 7, WEEKDAYS)),
        ]
    )
    rule = parse_rule(text)
    assume(rule.possible)
    return rule


def reading(zone: ZoneInfo, instant_ms: int) -> datetime:
    return (EPOCH + instant_ms * MS).astimezone(zone)


def matches(rule: CronRule, local: datetime) -> bool:
    return (
        local.second == 0
        and local.microsecond == 0
        and local.minute in rule.minutes
        and local.hour in rule.hours
        and local.month in rule.months
        and rule.matches_day(local.day, local.isoweekday() % 7)
    )


def is_occurrence(rule: CronRule, zone: ZoneInfo, instant_ms: int) -> bool:
    """A matching time's first instant, or the end of a gap holding a matching time."""
    here = reading(zone, instant_ms)
    if matches(rule, here) and here.fold == 0:
        return True
    just_before = reading(zone, instant_ms - 1)
    gap = here.utcoffset() - just_before.utcoffset()  # type: ignore[operator]
    if gap <= timedelta(0):
        return False
    wall = here.replace(tzinfo=None) - gap
    if wall.second or wall.microsecond:  # offsets before standard time have seconds
        wall = wall.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while wall <= here.replace(tzinfo=None):
        if matches(rule, wall.replace(tzinfo=zone)):
            return True
        wall += timedelta(minutes=1)
    return False


@settings(max_examples=300, deadline=None)
@given(rules(), st.sampled_from(ZONES), instants)
def test_occurrences_strictly_increase_and_each_matches(
    rule: CronRule, zone_name: str, start: int
) -> None:
    zone = load_zone(zone_name)
    instant = start
    for _ in range(6):
        following = next_after(rule, zone, instant)
        assert following is not None and following > instant
        assert is_occurrence(rule, zone, following)
        instant = following


@settings(max_examples=300, deadline=None)
@given(rules(), st.sampled_from(HISTORIC_ZONES), historic_instants)
def test_occurrences_match_since_local_mean_time(
    rule: CronRule, zone_name: str, start: int
) -> None:
    """Before standard time offsets had seconds, and old changes were odd; the rules hold."""
    zone = load_zone(zone_name)
    instant = start
    for _ in range(4):
        following = next_after(rule, zone, instant)
        assert following is not None and following > instant
        assert is_occurrence(rule, zone, following)
        assert latest_at_or_before(rule, zone, following) == following
        assert latest_at_or_before(rule, zone, following - 1) == latest_at_or_before(
            rule, zone, instant
        )
        instant = following


@settings(max_examples=300, deadline=None)
@given(rules(), st.sampled_from(ZONES), st.integers(MIN_MS, MAX_MS))
def test_any_instant_of_the_range_has_an_answer_in_the_range(
    rule: CronRule, zone_name: str, instant: int
) -> None:
    zone = load_zone(zone_name)
    following = next_after(rule, zone, instant)
    latest = latest_at_or_before(rule, zone, instant)
    assert following is None or instant < following <= MAX_MS
    assert latest is None or MIN_MS <= latest <= instant


@settings(max_examples=300, deadline=None)
@given(rules(), st.sampled_from(ZONES), instants)
def test_latest_and_next_chain(rule: CronRule, zone_name: str, instant: int) -> None:
    zone = load_zone(zone_name)
    following = next_after(rule, zone, instant)
    latest = latest_at_or_before(rule, zone, instant)
    assert following is not None and latest is not None
    # no occurrence lies strictly between the latest and the next
    assert latest <= instant < following
    assert next_after(rule, zone, latest) == following
    assert latest_at_or_before(rule, zone, following) == following
    assert latest_at_or_before(rule, zone, following - 1) == latest
    assert is_occurrence(rule, zone, latest)


@settings(max_examples=200, deadline=None)
@given(rules(), st.sampled_from(ZONES), instants, st.integers(0, 2000 * 86_400_000))
def test_catch_up_delivers_the_latest_due_and_targets_the_next(
    rule: CronRule, zone_name: str, created: int, delay: int
) -> None:
    """A dispatch accepted at A, never before the target, delivers the latest occurrence not
    after A; the next target is the first strictly after A."""
    zone = load_zone(zone_name)
    target = next_after(rule, zone, created)
    assert target is not None
    accepted = target + delay
    delivered = latest_at_or_before(rule, zone, accepted)
    assert delivered is not None and target <= delivered <= accepted
    upcoming = next_after(rule, zone, accepted)
    assert upcoming is not None and upcoming > accepted
    assert next_after(rule, zone, delivered) == upcoming


@settings(max_examples=200, deadline=None)
@given(rules(), st.sampled_from(ZONES), instants)
def test_the_first_target_is_the_next_occurrence_within_ten_years(
    rule: CronRule, zone_name: str, now: int
) -> None:
    zone = load_zone(zone_name)
    following = next_after(rule, zone, now)
    try:
        first = first_occurrence(rule, zone, now)
    except ToolError as error:
        assert error.code == "invalid_rule"
        assert following is None or following > now + TEN_YEARS_MS
    else:
        assert first == following and first <= now + TEN_YEARS_MS


@pytest.mark.parametrize(
    ("expression", "now", "expected"),
    [
        ("0 9 * * MON-FRI", "2027-03-26T12:00:00.000Z", "2027-03-29T07:00:00.000Z"),
        ("0 0 29 2 *", "2027-01-01T00:00:00.000Z", "2028-02-28T23:00:00.000Z"),
        ("59 23 31 12 *", "9999-12-30T00:00:00.000Z", "9999-12-31T22:59:00.000Z"),
    ],
    ids=["the next weekday", "the next leap day", "the last day of 9999 in Berlin"],
)
def test_a_first_target(expression: str, now: str, expected: str) -> None:
    zone = load_zone("Europe/Berlin")
    assert first_occurrence(parse_rule(expression), zone, parse_instant(now)) == parse_instant(
        expected
    )


@pytest.mark.parametrize(
    ("expression", "zone_name", "now", "expected"),
    [
        ("0 0 30 2 *", "UTC", "2027-01-01T00:00:00.000Z", "invalid_rule"),
        ("0 0 31 4,6,9,11 *", "UTC", "2027-01-01T00:00:00.000Z", "invalid_rule"),
        # Feb 29 falls on a Sunday or Thursday in 2032 and then not until 2052
        ("0 0 29 2 */4", "UTC", "2033-01-01T00:00:00.000Z", "invalid_rule"),
        ("0 0 30 2 *", "UTC", "9995-01-01T00:00:00.000Z", "invalid_rule"),
        ("0 0 1 1 *", "UTC", "9999-06-01T00:00:00.000Z", "time_out_of_range"),
        # 9999-12-31 23:00 in New York is already past 9999 in UTC
        ("0 23 31 12 *", "America/New_York", "9999-12-01T00:00:00.000Z", "time_out_of_range"),
    ],
    ids=[
        "30 February",
        "the 31st of a 30-day month",
        "no match in ten years",
        "never, even near 9999",
        "the next is in 10000",
        "the next is past 9999 in UTC",
    ],
)
def test_a_rule_without_a_first_target(
    expression: str, zone_name: str, now: str, expected: str
) -> None:
    with pytest.raises(ToolError) as caught:
        first_occurrence(parse_rule(expression), load_zone(zone_name), parse_instant(now))
    assert caught.value.code == expected


def test_next_and_latest_at_the_ends_of_the_range() -> None:
    rule, zone = parse_rule("0 12 * * *"), load_zone("Pacific/Kiritimati")  # +14:00
    assert next_after(rule, zone, MAX_MS) is None
    assert latest_at_or_before(rule, zone, MAX_MS) == parse_instant("9999-12-30T22:00:00.000Z")
    first = parse_instant("0001-01-01T00:00:00.000Z")
    west = load_zone("America/New_York")  # -04:56:02 before 1883
    assert latest_at_or_before(parse_rule("0 0 1 1 *"), west, first) is None
    assert next_after(rule, west, first) is not None


# ---------------------------------------------------------------- against croniter


@st.composite
def shared_rules(draw: st.DrawFn) -> str:
    """The part of the grammar croniter reads the same way: day fields either ``*`` or
    restricted without any ``*``, no ranges of one value, and no steps in the day of the week."""
    day_of_month = draw(
        st.one_of(st.just("*"), general_field(1, 31, star_steps=False, strict_ranges=True))
    )
    day_of_week = draw(
        st.one_of(
            st.just("*"),
            st.sampled_from(
                ["1-5", "MON-FRI", "0", "7", "SUN", "sat,sun", "1,3,5", "2-4,6", "wed"]
            ),
        )
    )
    assume("*" not in day_of_month or day_of_month == "*")  # croniter: any * is *
    return " ".join(
        [
            draw(minute_field(strict_ranges=True)),
            draw(general_field(0, 23, strict_ranges=True)),
            day_of_month,
            draw(general_field(1, 12, MONTHS, strict_ranges=True)),
            day_of_week,
        ]
    )


@settings(max_examples=300, deadline=None)
@given(shared_rules(), instants)
def test_in_utc_the_occurrences_are_croniters(text: str, start: int) -> None:
    rule = parse_rule(text)
    assume(rule.possible)
    zone = load_zone("UTC")
    theirs = croniter(text, EPOCH + start * MS)
    instant = start
    for _ in range(8):
        ours = next_after(rule, zone, instant)
        expected = theirs.get_next(datetime)
        assert ours is not None
        assert EPOCH + ours * MS == expected, text
        instant = ours


def test_the_differential_run_can_fail() -> None:
    """croniter and the grammar part ways where the contract says: 1/2 includes Sunday."""
    start = datetime(2027, 1, 2, 12, tzinfo=UTC)  # a Saturday afternoon
    theirs = croniter("0 9 * * 1/2", start).get_next(datetime)
    ours = next_after(parse_rule("0 9 * * 1/2"), load_zone("UTC"), int(start.timestamp() * 1000))
    assert theirs.date() == date(2027, 1, 4) and ours is not None
    assert (EPOCH + ours * MS).date() == date(2027, 1, 3)
