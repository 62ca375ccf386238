"""The occurrences of a calendar rule in its zone (docs/decisions.md#calendar-rules).

Each matching local wall-clock time (second 0) gives one occurrence: a time that exists
once is that instant; a time that exists twice (clocks set back) is only its earlier
instant; a time that does not exist (clocks set forward) is the instant the gap ends.
All of them are one definition: the occurrence of wall time ``w`` is the first instant
whose wall-clock reading is ``w`` or later. That is monotone in ``w``, so the occurrences
are strictly increasing once the times a gap collapses are counted once.

Time is passed in as integer epoch milliseconds; zones are ``zoneinfo`` objects loaded by
``timesel.load_zone`` from the pinned tzdata. The search jumps to the next matching month,
day and time of day rather than walking minutes. Nothing here reads the clock or the
process time zone.
"""

from __future__ import annotations

import bisect
import zoneinfo
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final, NamedTuple

from dsh_schedule.shared.core.cron import CronRule, read_cron_selector
from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.instant import MAX_MS, MIN_MS
from dsh_schedule.shared.core.timesel import load_zone

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_ORDINAL: Final[int] = date(1970, 1, 1).toordinal()
_MS: Final = timedelta(milliseconds=1)
_MINUTE_MS: Final[int] = 60_000
_DAY_MINUTES: Final[int] = 1440
_DAY_MS: Final[int] = 86_400_000
# Wall times are counted in minutes since 1970-01-01 00:00 local ("wall minutes").
_FIRST_WALL: Final[int] = (date.min.toordinal() - _EPOCH_ORDINAL) * _DAY_MINUTES
_LAST_WALL: Final[int] = (date.max.toordinal() - _EPOCH_ORDINAL + 1) * _DAY_MINUTES - 1
_MONTH_LENGTHS: Final[tuple[int, ...]] = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

# The longest ten calendar years (three leap days): a rule must occur within them.
TEN_YEARS_MS: Final[int] = 3653 * _DAY_MS

_MSG_NEVER: Final[str] = (
    "The cron rule matches no time in the next ten years (such as the 30th of February); "
    "choose another rule."
)


# ---------------------------------------------------------------- the calendar side


def _days_of(rule: CronRule, year: int, month: int) -> tuple[int, ...]:
    """The rule's matching days of a month it names (ascending)."""
    length = _MONTH_LENGTHS[month - 1]
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        length = 29
    first = (date(year, month, 1).weekday() + 1) % 7  # Sunday 0, as in cron
    return rule.days_of_month(length, first)


def _wall(year: int, month: int, day: int, minute_of_day: int) -> int:
    return (date(year, month, day).toordinal() - _EPOCH_ORDINAL) * _DAY_MINUTES + minute_of_day


def _next_wall(rule: CronRule, lower: int) -> int | None:
    """The first matching wall minute at or after ``lower``; None past year 9999."""
    if lower > _LAST_WALL or not rule.possible:
        return None
    lower = max(lower, _FIRST_WALL)
    day_index, minute = divmod(lower, _DAY_MINUTES)
    today = date.fromordinal(day_index + _EPOCH_ORDINAL)
    year, month, times = today.year, today.month, rule.times
    if month in rule.months:
        days = _days_of(rule, year, month)
        i = bisect.bisect_left(days, today.day)
        if i < len(days) and days[i] == today.day:
            j = bisect.bisect_left(times, minute)
            if j < len(times):
                return lower - minute + times[j]
            i += 1
        if i < len(days):
            return _wall(year, month, days[i], times[0])
    while True:
        k = bisect.bisect_right(rule.months, month)
        if k < len(rule.months):
            month = rule.months[k]
        else:
            year, month = year + 1, rule.months[0]
            if year > date.max.year:
                return None
        days = _days_of(rule, year, month)
        if days:
            return _wall(year, month, days[0], times[0])


def _previous_wall(rule: CronRule, upper: int) -> int | None:
    """The last matching wall minute at or before ``upper``; None before year 1."""
    if upper < _FIRST_WALL or not rule.possible:
        return None
    upper = min(upper, _LAST_WALL)
    day_index, minute = divmod(upper, _DAY_MINUTES)
    today = date.fromordinal(day_index + _EPOCH_ORDINAL)
    year, month, times = today.year, today.month, rule.times
    if month in rule.months:
        days = _days_of(rule, year, month)
        i = bisect.bisect_right(days, today.day) - 1
        if i >= 0 and days[i] == today.day:
            j = bisect.bisect_right(times, minute) - 1
            if j >= 0:
                return upper - minute + times[j]
            i -= 1
        if i >= 0:
            return _wall(year, month, days[i], times[-1])
    while True:
        k = bisect.bisect_left(rule.months, month) - 1
        if k >= 0:
            month = rule.months[k]
        else:
            year, month = year - 1, rule.months[-1]
            if year < date.min.year:
                return None
        days = _days_of(rule, year, month)
        if days:
            return _wall(year, month, days[-1], times[-1])


# ---------------------------------------------------------------- the zone side


def _offset_ms(offset: timedelta | None) -> int:
    if offset is None:
        # A zone that names no offset for a time cannot place it (tzdata zones always do).
        raise ToolError("invalid_time_zone")
    return offset // _MS


def _offset_at(zone: zoneinfo.ZoneInfo, instant_ms: int) -> int:
    """The zone's offset east of UTC at an instant, in milliseconds."""
    local = (_EPOCH + timedelta(milliseconds=instant_ms)).astimezone(zone)
    return _offset_ms(local.utcoffset())


def _not_yet_reached(zone: zoneinfo.ZoneInfo, instant_ms: int) -> int:
    """The first wall minute the clock has not shown by ``instant_ms``: the occurrence of a
    wall time from it on is after the instant, of any earlier one at or before it.

    That is the minute after the reading, except on the second pass through set-back
    times: then the clock has already shown every time up to the moment it was set back.
    """
    try:
        local = (_EPOCH + timedelta(milliseconds=instant_ms)).astimezone(zone)
    except OverflowError:
        # The reading is past 9999 or before year 1: every wall time, or none, was shown.
        return _LAST_WALL + 1 if instant_ms > 0 else _FIRST_WALL
    after = _offset_ms(local.utcoffset())
    if not local.fold:
        return (instant_ms + after) // _MINUTE_MS + 1
    before = _offset_ms(local.replace(fold=0).utcoffset())
    # The clocks went back at T, a whole second in tzdata, between the first pass through
    # this reading (instant - (before - after)) and now; they had shown up to T + before.
    low, high = (instant_ms - (before - after)) // 1000, instant_ms // 1000
    while high - low > 1:
        middle = (low + high) // 2
        if _offset_at(zone, middle * 1000) == after:
            high = middle
        else:
            low = middle
    return -(-(high * 1000 + before) // _MINUTE_MS)


def _gap_end(zone: zoneinfo.ZoneInfo, wall_ms: int, before_ms: int, after_ms: int) -> int:
    """The first instant reading ``wall_ms`` or later, for a wall time in a gap.

    ``before_ms`` reads earlier than the gap (it was placed with the offset after it) and
    ``after_ms`` reads later (placed with the offset before it). Transitions fall on whole
    seconds in tzdata, so a search over seconds finds the instant exactly.
    """
    low, high = before_ms // 1000, -(-after_ms // 1000)
    if high * 1000 > MAX_MS:
        return high * 1000
    while high - low > 1:
        middle = (low + high) // 2
        if middle * 1000 + _offset_at(zone, middle * 1000) >= wall_ms:
            high = middle
        else:
            low = middle
    return high * 1000


def _occurrence(zone: zoneinfo.ZoneInfo, wall: int) -> int:
    """The occurrence of a wall minute: the first instant reading it or later."""
    day_index, minute = divmod(wall, _DAY_MINUTES)
    day = date.fromordinal(day_index + _EPOCH_ORDINAL)
    local = datetime(day.year, day.month, day.day, minute // 60, minute % 60, tzinfo=zone)
    before = _offset_ms(zone.utcoffset(local))  # fold 0: the offset before a transition
    after = _offset_ms(zone.utcoffset(local.replace(fold=1)))
    wall_ms = wall * _MINUTE_MS
    if before >= after:
        # Exists once (equal offsets), or twice: the earlier instant has the larger offset.
        return wall_ms - before
    return _gap_end(zone, wall_ms, wall_ms - after, wall_ms - before)


# ---------------------------------------------------------------- the domain's questions


def next_after(rule: CronRule, zone: zoneinfo.ZoneInfo, instant_ms: int) -> int | None:
    """The rule's first occurrence strictly after ``instant_ms``; None past year 9999."""
    wall = _next_wall(rule, _not_yet_reached(zone, instant_ms))
    if wall is None:
        return None
    occurrence = _occurrence(zone, wall)
    return occurrence if occurrence <= MAX_MS else None


def latest_at_or_before(rule: CronRule, zone: zoneinfo.ZoneInfo, instant_ms: int) -> int | None:
    """The rule's last occurrence at or before ``instant_ms`` (the one a dispatch accepted
    then delivers); None before year 1."""
    wall = _previous_wall(rule, _not_yet_reached(zone, instant_ms) - 1)
    if wall is None:
        return None
    occurrence = _occurrence(zone, wall)
    return occurrence if occurrence >= MIN_MS else None


def first_occurrence(rule: CronRule, zone: zoneinfo.ZoneInfo, now_ms: int) -> int:
    """The first target of a rule created at ``now_ms``: its first occurrence after it.

    ``invalid_rule`` when none falls in the next ten years; ``time_out_of_range`` when
    those years reach past 9999 and the rule matches some date, but none before then.
    """
    occurrence = next_after(rule, zone, now_ms)
    horizon = now_ms + TEN_YEARS_MS
    if occurrence is not None and occurrence <= horizon:
        return occurrence
    if horizon <= MAX_MS or not rule.possible:
        raise ToolError("invalid_rule", _MSG_NEVER)
    raise ToolError("time_out_of_range")


class CronTarget(NamedTuple):
    """A ``cron`` selector resolved at a create: what its record stores."""

    rule: CronRule
    time_zone: str
    scheduled_at_ms: int


def resolve_cron(value: Any, *, now_ms: int, implicit_zone: Callable[[], str]) -> CronTarget:
    """The rule, its zone and its first occurrence strictly after ``now_ms``.

    Checks run in the contract's order: the selector's shape and the grammar
    (``invalid_rule``), the frequency (``frequency_too_high``), then the zone
    (``invalid_time_zone``; ``implicit_zone`` is called only when the selector names none,
    and may raise ``timezone_confirmation_required``), then the first occurrence
    (``invalid_rule`` or ``time_out_of_range``).
    """
    selector = read_cron_selector(value)
    zone_name = selector.time_zone if selector.time_zone is not None else implicit_zone()
    zone = load_zone(zone_name)
    return CronTarget(selector.rule, zone_name, first_occurrence(selector.rule, zone, now_ms))
