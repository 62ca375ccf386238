"""Calendar rules: the five-field cron grammar, its static limits and the ``cron`` selector
(docs/decisions.md#calendar-rules).

A rule is ``minute hour day-of-month month day-of-week``, fields separated by whitespace.
A field is a comma list of items; an item is ``*``, a value, an ascending range ``a-b``,
or either followed by ``/n`` (n ≥ 1; ``a/n`` runs from ``a`` to the field's maximum).
Months may be ``JAN``-``DEC`` and days of the week ``SUN``-``SAT`` (case-insensitive);
0 and 7 are Sunday, and a range must ascend after the names are read (``MON-SUN`` does
not). There is no seconds or year field, no ``L``, ``W``, ``#``, ``?`` and no ``@`` name.

When the day-of-month and the day-of-week fields both begin with something other than
``*``, a day matches when either does; otherwise both must (the classic cron day rule).

Checks run in this order, so the first applicable code is the one answered: the
selector's shape and the grammar (``invalid_rule``), then the times of day
(``frequency_too_high``: two of them less than five minutes apart, cyclically over the
day). Zones and occurrences come after, in ``cron_occurrences``. Nothing here reads the
clock or a time zone.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from dsh_schedule.shared.core.errors import ToolError

# Whitespace in the grammar and in the stored form: ASCII space, tab and line breaks only.
_WHITESPACE_CHARS: Final[str] = " \t\n\r\f\v"
_WHITESPACE: Final = re.compile(f"[{_WHITESPACE_CHARS}]+")
_NUMBER: Final = re.compile(r"[0-9]+")
_NAME: Final = re.compile(r"[A-Za-z]{3}")
# Longer than any value or useful step once leading zeros are gone; int() never sees more.
_MAX_DIGITS: Final[int] = 4
_TOO_LARGE: Final[int] = 10_000

MIN_GAP_MINUTES: Final[int] = 5
_DAY_MINUTES: Final[int] = 1440
_LONGEST: Final[tuple[int, ...]] = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_SELECTOR_KEYS: Final = frozenset({"expression", "time_zone"})

_MONTH_NAMES: Final[dict[str, int]] = {
    name: number
    for number, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"),
        start=1,
    )
}
_WEEKDAY_NAMES: Final[dict[str, int]] = {
    name: number for number, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))
}

_MSG_SELECTOR: Final[str] = (
    'cron must be an expression string such as "0 9 * * MON-FRI", or an object '
    '{"expression": "0 9 * * MON-FRI", "time_zone": "Area/Location"} (time_zone optional) '
    "with no other keys."
)
_MSG_ZONE_TYPE: Final[str] = "cron.time_zone must be a string when it is given."
_MSG_SHAPE: Final[str] = (
    "A cron expression is five fields separated by spaces: minute hour day-of-month month "
    'day-of-week, such as "0 9 * * MON-FRI" (no seconds or year field, no @ names).'
)
_MSG_FREQUENCY: Final[str] = (
    "A cron rule's times of day must be at least 5 minutes apart (such as */5 for the "
    "minute), counting from the last time of one day to the first of the next."
)


class _Field(NamedTuple):
    """One of the five fields: its name in messages, its bounds and its names."""

    label: str
    low: int
    high: int
    names: dict[str, int]


_FIELDS: Final[tuple[_Field, ...]] = (
    _Field("minute", 0, 59, {}),
    _Field("hour", 0, 23, {}),
    _Field("day-of-month", 1, 31, {}),
    _Field("month", 1, 12, _MONTH_NAMES),
    _Field("day-of-week", 0, 7, _WEEKDAY_NAMES),
)


def _field_message(field: _Field) -> str:
    names = {"month": " or JAN-DEC", "day-of-week": " or SUN-SAT (0 and 7 are Sunday)"}
    return (
        f"The cron {field.label} field must be a comma list of items, each *, a value "
        f"{field.low}-{field.high}{names.get(field.label, '')} or an ascending range a-b, "
        "optionally followed by /n with n at least 1 (no L, W, # or ?)."
    )


@dataclass(frozen=True, slots=True)
class CronRule:
    """A parsed rule. ``expression`` is its stored form (see ``normalise_expression``).

    ``weekdays`` counts Sunday as 0 (a 7 in the expression is read as 0); ``either_day``
    is the classic cron day rule: a day matches on either day field, not on both.
    ``times`` are the matching minutes of the day, ascending. ``possible`` says whether
    any Gregorian date matches (``0 0 30 2 *`` never does).
    """

    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: tuple[int, ...]
    weekdays: frozenset[int]
    either_day: bool
    times: tuple[int, ...]
    possible: bool
    _month_days: dict[int, tuple[int, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def matches_day(self, day: int, weekday: int) -> bool:
        """Whether the rule's day fields take a day (``weekday`` 0-6, Sunday 0)."""
        on_day, on_weekday = day in self.days, weekday in self.weekdays
        return (on_day or on_weekday) if self.either_day else (on_day and on_weekday)

    def days_of_month(self, length: int, first: int) -> tuple[int, ...]:
        """The matching days, ascending, of a month of ``length`` days whose first day has
        weekday ``first`` (Sunday 0); worked out once per kind of month."""
        key = length * 7 + first
        found = self._month_days.get(key)
        if found is None:
            found = tuple(
                day for day in range(1, length + 1) if self.matches_day(day, (first + day - 1) % 7)
            )
            self._month_days[key] = found
        return found


class CronSelector(NamedTuple):
    """A ``cron`` selector: the rule and the zone it names, if any (not yet validated)."""

    rule: CronRule
    time_zone: str | None


def normalise_expression(text: str) -> str:
    """The stored form: trimmed, each run of whitespace made one space, otherwise as given."""
    return " ".join(_WHITESPACE.split(text.strip(_WHITESPACE_CHARS)))


def _number(text: str) -> int | None:
    """An ASCII decimal with any leading zeros; a long one reads as too large."""
    if _NUMBER.fullmatch(text) is None:
        return None
    digits = text.lstrip("0")
    return _TOO_LARGE if len(digits) > _MAX_DIGITS else int(digits or "0")


def _value(text: str, field: _Field) -> int | None:
    """A value within the field's bounds, or one of its names; None otherwise."""
    number = _number(text)
    if number is None and field.names and _NAME.fullmatch(text):
        number = field.names.get(text.upper())
    if number is None or not field.low <= number <= field.high:
        return None
    return number


def _parse_item(item: str, field: _Field) -> range:
    base, slash, step_text = item.partition("/")
    step = _number(step_text) if slash else 1
    if step is None or step < 1:
        raise ToolError("invalid_rule", _field_message(field))
    if base == "*":
        return range(field.low, field.high + 1, step)
    first, dash, last = base.partition("-")
    low = _value(first, field)
    high = _value(last, field) if dash else (field.high if slash else low)
    if low is None or high is None or low > high:
        raise ToolError("invalid_rule", _field_message(field))
    return range(low, high + 1, step)


def _parse_field(text: str, field: _Field) -> frozenset[int]:
    values: set[int] = set()
    for item in text.split(","):
        values.update(_parse_item(item, field))
    return frozenset(values)


def _check_frequency(times: tuple[int, ...]) -> None:
    """``frequency_too_high`` when two times of day can be under five minutes apart."""
    if len(times) < 2:
        return
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    gaps.append(times[0] + _DAY_MINUTES - times[-1])
    if min(gaps) < MIN_GAP_MINUTES:
        raise ToolError("frequency_too_high", _MSG_FREQUENCY)


def _possible(days: frozenset[int], months: frozenset[int], either_day: bool) -> bool:
    """Whether some Gregorian date matches. Every month has every weekday, and each day of
    a month falls on every weekday in some year, so only a day-of-month that no named
    month has (``0 0 30 2 *``) can keep a rule from ever matching."""
    return either_day or any(day <= _LONGEST[month - 1] for month in months for day in days)


@functools.lru_cache(maxsize=1024)
def parse_rule(text: str) -> CronRule:
    """The rule an expression string states; ``invalid_rule`` or ``frequency_too_high``."""
    expression = normalise_expression(text)
    parts = expression.split(" ")
    if len(parts) != len(_FIELDS):
        raise ToolError("invalid_rule", _MSG_SHAPE)
    minutes, hours, days, months, raw_weekdays = (
        _parse_field(part, field) for part, field in zip(parts, _FIELDS, strict=True)
    )
    times = tuple(sorted(hour * 60 + minute for hour in hours for minute in minutes))
    _check_frequency(times)
    weekdays = frozenset(weekday % 7 for weekday in raw_weekdays)
    either_day = not parts[2].startswith("*") and not parts[4].startswith("*")
    return CronRule(
        expression=expression,
        minutes=minutes,
        hours=hours,
        days=days,
        months=tuple(sorted(months)),
        weekdays=weekdays,
        either_day=either_day,
        times=times,
        possible=_possible(days, months, either_day),
    )


def read_cron_selector(value: Any) -> CronSelector:
    """A ``cron`` selector: an expression string, or ``{"expression", "time_zone"?}``.

    Anything else is ``invalid_rule``, as is a ``time_zone`` that is not a string; the
    zone's name is checked later, after the grammar and the frequency.
    """
    if isinstance(value, str):
        return CronSelector(parse_rule(value), None)
    if not isinstance(value, dict) or not {"expression"} <= value.keys() <= _SELECTOR_KEYS:
        raise ToolError("invalid_rule", _MSG_SELECTOR)
    expression, zone = value["expression"], value.get("time_zone")
    if not isinstance(expression, str):
        raise ToolError("invalid_rule", _MSG_SELECTOR)
    if "time_zone" in value and not isinstance(zone, str):
        raise ToolError("invalid_rule", _MSG_ZONE_TYPE)
    return CronSelector(parse_rule(expression), zone)
