"""The cron grammar, its frequency limit and the ``cron`` selector
(docs/decisions.md#calendar-rules): each row is one sentence of the contract."""

from __future__ import annotations

from typing import Any

import pytest

from dsh_schedule.shared.core.cron import normalise_expression, parse_rule, read_cron_selector
from dsh_schedule.shared.core.errors import ToolError

ALL_MINUTES = frozenset(range(60))


def fields(expression: str) -> tuple[Any, ...]:
    rule = parse_rule(expression)
    return (
        sorted(rule.minutes),
        sorted(rule.hours),
        sorted(rule.days),
        list(rule.months),
        sorted(rule.weekdays),
        rule.either_day,
    )


def code(value: Any) -> str:
    with pytest.raises(ToolError) as caught:
        read_cron_selector(value)
    return caught.value.code


ALL_DAYS = list(range(1, 32))
ALL_MONTHS = list(range(1, 13))
WEEK = list(range(7))

VALID = [
    # (sentence, expression, (minutes, hours, days, months, weekdays, either_day))
    ("a value in each field", "0 9 1 1 1", ([0], [9], [1], [1], [1], True)),
    ("* is every value of its field", "0 9 * * *", ([0], [9], ALL_DAYS, ALL_MONTHS, WEEK, False)),
    ("leading zeros are allowed", "00 09 01 01 01", ([0], [9], [1], [1], [1], True)),
    ("the bounds of every field are allowed", "59 23 31 12 7", ([59], [23], [31], [12], [0], True)),
    (
        "a comma list of items",
        "0,30 9,17 1,15 * *",
        ([0, 30], [9, 17], [1, 15], ALL_MONTHS, WEEK, False),
    ),
    (
        "a range a-b includes both ends",
        "0 9-11 * * *",
        ([0], [9, 10, 11], ALL_DAYS, ALL_MONTHS, WEEK, False),
    ),
    ("a range may be one value", "0 9-9 * * *", ([0], [9], ALL_DAYS, ALL_MONTHS, WEEK, False)),
    (
        "*/n steps from the field's minimum",
        "*/15 0 * * *",
        ([0, 15, 30, 45], [0], ALL_DAYS, ALL_MONTHS, WEEK, False),
    ),
    (
        "a-b/n steps within the range",
        "10-40/10 0 * * *",
        ([10, 20, 30, 40], [0], ALL_DAYS, ALL_MONTHS, WEEK, False),
    ),
    (
        "a/n runs from a to the field's maximum",
        "50/5 0 * * *",
        ([50, 55], [0], ALL_DAYS, ALL_MONTHS, WEEK, False),
    ),
    (
        "a step past the range leaves its start",
        "0 9/100 * * *",
        ([0], [9], ALL_DAYS, ALL_MONTHS, WEEK, False),
    ),
    (
        "*/n on the day of month starts at 1",
        "0 0 */10 * *",
        ([0], [0], [1, 11, 21, 31], ALL_MONTHS, WEEK, False),
    ),
    ("*/n on the month starts at 1", "0 0 1 */4 *", ([0], [0], [1], [1, 5, 9], WEEK, False)),
    ("month names, any case", "0 0 1 jan,Jun,DEC *", ([0], [0], [1], [1, 6, 12], WEEK, False)),
    ("a range of month names", "0 0 1 MAR-MAY *", ([0], [0], [1], [3, 4, 5], WEEK, False)),
    (
        "day names map to 0-6 with SUN 0",
        "0 9 * * SUN,mon,Sat",
        ([0], [9], ALL_DAYS, ALL_MONTHS, [0, 1, 6], False),
    ),
    (
        "MON-FRI is Monday to Friday",
        "0 9 * * MON-FRI",
        ([0], [9], ALL_DAYS, ALL_MONTHS, [1, 2, 3, 4, 5], False),
    ),
    ("0 and 7 are both Sunday", "0 9 * * 0,7", ([0], [9], ALL_DAYS, ALL_MONTHS, [0], False)),
    ("1-7 is Monday to Sunday", "0 9 * * 1-7", ([0], [9], ALL_DAYS, ALL_MONTHS, WEEK, False)),
    (
        "the day-of-week maximum is 7, so 1/2 is 1,3,5,7",
        "0 9 * * 1/2",
        ([0], [9], ALL_DAYS, ALL_MONTHS, [0, 1, 3, 5], False),
    ),
    (
        "a range may end on 7 after a name",
        "0 9 * * FRI-7",
        ([0], [9], ALL_DAYS, ALL_MONTHS, [0, 5, 6], False),
    ),
    (
        "*/2 on the day of week is 0,2,4,6",
        "0 9 * * */2",
        ([0], [9], ALL_DAYS, ALL_MONTHS, [0, 2, 4, 6], False),
    ),
    (
        "both day fields restricted: either matches",
        "0 9 1 * MON",
        ([0], [9], [1], ALL_MONTHS, [1], True),
    ),
    (
        "a day-of-month beginning with * counts as *: both must match",
        "0 9 */2 * MON",
        ([0], [9], list(range(1, 32, 2)), ALL_MONTHS, [1], False),
    ),
    (
        "a day-of-week beginning with * counts as *: both must match",
        "0 9 13 * */7",
        ([0], [9], [13], ALL_MONTHS, [0], False),
    ),
    (
        "a list beginning with * counts as *",
        "0 9 *,13 * 5",
        ([0], [9], ALL_DAYS, ALL_MONTHS, [5], False),
    ),
    (
        "fields may be separated by runs of spaces, tabs and line breaks",
        " 0\t9  *\n* * ",
        ([0], [9], ALL_DAYS, ALL_MONTHS, WEEK, False),
    ),
    (
        "*/5 times are exactly 5 minutes apart",
        "*/5 * * * *",
        (list(range(0, 60, 5)), list(range(24)), ALL_DAYS, ALL_MONTHS, WEEK, False),
    ),
    (
        "the last time of a day and the first of the next, 5 minutes apart",
        "0,55 0,23 * * *",
        ([0, 55], [0, 23], ALL_DAYS, ALL_MONTHS, WEEK, False),
    ),
    (
        "30 February is grammatical (it never occurs)",
        "0 0 30 2 *",
        ([0], [0], [30], [2], WEEK, False),
    ),
]


@pytest.mark.parametrize(
    ("expression", "expected"), [row[1:] for row in VALID], ids=[row[0] for row in VALID]
)
def test_a_valid_expression_states_these_fields(expression: str, expected: tuple[Any, ...]) -> None:
    assert fields(expression) == expected


INVALID = [
    # (sentence, value, code)
    ("four fields", "0 9 * *", "invalid_rule"),
    ("six fields (no seconds or year)", "0 0 9 * * *", "invalid_rule"),
    ("an empty expression", "", "invalid_rule"),
    ("only whitespace", " \t ", "invalid_rule"),
    ("no @ macros", "@daily", "invalid_rule"),
    ("no @ macros with fields", "@reboot 0 9 * *", "invalid_rule"),
    ("no L in the day of month", "0 9 L * *", "invalid_rule"),
    ("no L in the day of week", "0 9 * * 5L", "invalid_rule"),
    ("no W", "0 9 15W * *", "invalid_rule"),
    ("no #", "0 9 * * 1#2", "invalid_rule"),
    ("no ?", "0 9 ? * *", "invalid_rule"),
    ("minute 60", "60 9 * * *", "invalid_rule"),
    ("hour 24", "0 24 * * *", "invalid_rule"),
    ("day of month 0", "0 9 0 * *", "invalid_rule"),
    ("day of month 32", "0 9 32 * *", "invalid_rule"),
    ("month 0", "0 9 * 0 *", "invalid_rule"),
    ("month 13", "0 9 * 13 *", "invalid_rule"),
    ("day of week 8", "0 9 * * 8", "invalid_rule"),
    ("a negative value", "-1 9 * * *", "invalid_rule"),
    ("a descending range", "0 17-9 * * *", "invalid_rule"),
    ("MON-SUN descends after mapping (SUN is 0)", "0 9 * * MON-SUN", "invalid_rule"),
    ("a range that wraps", "0 9 * * FRI-MON", "invalid_rule"),
    ("a step of 0", "*/0 9 * * *", "invalid_rule"),
    ("an empty step", "*/ 9 * * *", "invalid_rule"),
    ("a step that is a name", "0 9 * * */MON", "invalid_rule"),
    ("two steps", "0 9/2/2 * * *", "invalid_rule"),
    ("a range of three", "0 1-2-3 * * *", "invalid_rule"),
    ("* as a range end", "0 *-5 * * *", "invalid_rule"),
    ("an empty item", "0 9,,17 * * *", "invalid_rule"),
    ("a trailing comma", "0 9, * * *", "invalid_rule"),
    ("month names only in the month field", "0 9 JAN * *", "invalid_rule"),
    ("day names only in the day-of-week field", "0 9 * MON *", "invalid_rule"),
    ("a day name out of the table", "0 9 * * SUX", "invalid_rule"),
    ("a full day name", "0 9 * * MONDAY", "invalid_rule"),
    ("a non-ASCII letter that uppercases to a name", "0 9 * * \u017fun", "invalid_rule"),
    ("non-ASCII digits", "0 \u0669 * * *", "invalid_rule"),
    ("a no-break space is not a separator", "0\u00a09 * * *", "invalid_rule"),
    ("a sign", "+0 9 * * *", "invalid_rule"),
    ("a huge value", "0 9 * * " + "1" * 5000, "invalid_rule"),
    ("*/4 minutes are 4 apart", "*/4 * * * *", "frequency_too_high"),
    ("0,3 minutes are 3 apart", "0,3 9 * * *", "frequency_too_high"),
    ("every minute", "* * * * *", "frequency_too_high"),
    (
        "one minute of every hour, 4 apart across the day's end",
        "0,56 0,23 * * *",
        "frequency_too_high",
    ),
    ("23:58 and 00:00 are 2 minutes apart", "0,58 0,23 * * *", "frequency_too_high"),
    ("frequency counts times of day whatever the days", "0,1 9 1 1 *", "frequency_too_high"),
    ("grammar before frequency", "* * * * 8", "invalid_rule"),
    ("a number is not a selector", 9, "invalid_rule"),
    ("null is not a selector", None, "invalid_rule"),
    ("a list is not a selector", ["0 9 * * *"], "invalid_rule"),
    ("an object needs an expression", {"time_zone": "UTC"}, "invalid_rule"),
    ("an object's expression must be a string", {"expression": 9}, "invalid_rule"),
    ("an object with another key", {"expression": "0 9 * * *", "zone": "UTC"}, "invalid_rule"),
    (
        "time_zone null is a wrong type",
        {"expression": "0 9 * * *", "time_zone": None},
        "invalid_rule",
    ),
    (
        "an object's expression follows the grammar",
        {"expression": "*/4 * * * *", "time_zone": "Nowhere/Else"},
        "frequency_too_high",
    ),
]


@pytest.mark.parametrize(
    ("value", "expected"), [row[1:] for row in INVALID], ids=[row[0] for row in INVALID]
)
def test_an_invalid_selector_answers_its_code(value: Any, expected: str) -> None:
    assert code(value) == expected


def test_the_selector_carries_the_zone_unvalidated() -> None:
    """The zone's name is checked after the grammar, by the zone loader."""
    selector = read_cron_selector({"expression": "0 9 * * *", "time_zone": "Nowhere/Else"})
    assert selector.time_zone == "Nowhere/Else"
    assert read_cron_selector({"expression": "0 9 * * *"}).time_zone is None
    assert read_cron_selector("0 9 * * *").time_zone is None


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("0 9 * * MON-FRI", "0 9 * * MON-FRI"),
        ("  0   9 * *\tmon-fri \n", "0 9 * * mon-fri"),
        ("00 09 * * 1/2", "00 09 * * 1/2"),
    ],
    ids=["already stored form", "trimmed, runs made one space, case kept", "otherwise as given"],
)
def test_the_stored_form_is_trimmed_with_runs_of_whitespace_made_one_space(
    given: str, stored: str
) -> None:
    assert normalise_expression(given) == stored
    assert parse_rule(given).expression == stored


def test_the_day_rule_either_or_both() -> None:
    # Friday the 13th with both restricted: any 13th or any Friday
    either = parse_rule("0 9 13 * 5")
    assert either.matches_day(13, 1) and either.matches_day(6, 5)
    assert not either.matches_day(6, 1)
    # with */1 on the day of week, both must match
    both = parse_rule("0 9 13 * */1")
    assert both.matches_day(13, 1) and not both.matches_day(6, 5)


def test_a_rule_that_no_date_matches_is_known_impossible() -> None:
    assert not parse_rule("0 0 30 2 *").possible
    assert not parse_rule("0 0 31 4,6,9,11 *").possible
    assert parse_rule("0 0 29 2 *").possible
    assert parse_rule("0 0 31 2,3 *").possible
    assert parse_rule("0 0 30 2 MON").possible  # either rule: every Monday of February
