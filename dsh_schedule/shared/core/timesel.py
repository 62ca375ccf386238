"""Absolute ``at`` targets and IANA zones (docs/architecture.md#time).

An ``at`` selector is either a strict offset string
``YYYY-MM-DDTHH:mm:ss[.S|.SS|.SSS](Z|±HH:MM)`` or a local object
``{"date", "time", "time_zone"?}``. Both resolve to one integer epoch-millisecond
instant. Zone data comes only from the pinned ``tzdata`` package; nothing here reads the
operating system's zone files, the process time zone or the clock.

Checks run in this order, so the first applicable code is the one answered:
shape and syntax (``invalid_rule``) → zone name (``invalid_time_zone``) or the implicit
zone (``timezone_confirmation_required``) → representable range (``time_out_of_range``) →
daylight-saving gap (``invalid_rule``) → strictly future (``not_future``)
(docs/architecture.md#time).
"""

from __future__ import annotations

import functools
import importlib.resources
import re
import zoneinfo
from collections.abc import Callable
from datetime import date, datetime, timedelta
from typing import Any, Final, NamedTuple

from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.instant import MAX_MS, MIN_MS, to_datetime

_DAY_MS: Final[int] = 86_400_000
_EPOCH_DATE: Final = date(1970, 1, 1)

# re.ASCII keeps \d to 0-9; fullmatch() keeps a trailing newline out.
_AT_STRING = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,3}))?(Z|[+-]\d{2}:\d{2})",
    re.ASCII,
)
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)
_TIME = re.compile(r"(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,3}))?", re.ASCII)
# One path-safe segment of a zone name; the tzdata key list is the real authority.
_ZONE_SEGMENT = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9_+-]*", re.ASCII)
_AT_KEYS: Final = frozenset({"date", "time", "time_zone"})

_MSG_AT_SHAPE: Final[str] = (
    'at must be a string like "2027-03-28T09:30:00Z" or "2027-03-28T09:30:00+01:00", '
    'or an object {"date": "YYYY-MM-DD", "time": "HH:mm:ss", "time_zone": '
    '"Area/Location"} with no other keys.'
)
_MSG_AT_STRING: Final[str] = (
    "at string must be exactly YYYY-MM-DDTHH:mm:ss with an optional .S, .SS or .SSS "
    "fraction and then Z or an offset ±HH:MM (uppercase T and Z, no spaces, -00:00 not "
    "allowed), naming a real calendar date and time."
)
_MSG_AT_DATE: Final[str] = "at.date must be a real calendar date written YYYY-MM-DD."
_MSG_AT_TIME: Final[str] = (
    "at.time must be HH:mm:ss with an optional .S, .SS or .SSS fraction (hours 00-23, "
    "seconds 00-59)."
)
_MSG_AT_ZONE_TYPE: Final[str] = "at.time_zone must be a string when it is given."
_MSG_GAP: Final[str] = (
    "That local time does not exist in the time zone (it is skipped by a daylight-saving "
    "or calendar change); choose another time."
)


class _Wall(NamedTuple):
    """Validated local calendar fields; ``millisecond`` is 0-999."""

    year: int
    month: int
    day: int
    hour: int
    minute: int
    second: int
    millisecond: int


# ---------------------------------------------------------------- zones


@functools.lru_cache(maxsize=1)
def _tzdata_keys() -> frozenset[str]:
    """Every zone key the pinned tzdata package ships (its ``zones`` list)."""
    text = importlib.resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip())


def is_valid_zone(name: object) -> bool:
    """True for ``"UTC"`` or a tzdata ``Area/Location`` name (not ``Etc/*``)."""
    if not isinstance(name, str):
        return False
    if name == "UTC":
        return True
    segments = name.split("/")
    if not 2 <= len(segments) <= 3 or segments[0] == "Etc":
        return False
    if not all(_ZONE_SEGMENT.fullmatch(segment) for segment in segments):
        return False
    return name in _tzdata_keys()


@functools.lru_cache(maxsize=256)
def _load_valid_zone(name: str) -> zoneinfo.ZoneInfo:
    resource = importlib.resources.files("tzdata.zoneinfo")
    for segment in name.split("/"):
        resource = resource.joinpath(segment)
    with resource.open("rb") as stream:
        return zoneinfo.ZoneInfo.from_file(stream, key=name)


def load_zone(name: str) -> zoneinfo.ZoneInfo:
    """The zone for a valid name, read from the pinned tzdata; ``invalid_time_zone`` else."""
    if not is_valid_zone(name):
        raise ToolError("invalid_time_zone")
    return _load_valid_zone(name)


# ---------------------------------------------------------------- parsing


def _fraction_ms(digits: str | None) -> int:
    """``.S`` is tenths, ``.SS`` hundredths, ``.SSS`` milliseconds."""
    if digits is None:
        return 0
    return int(digits.ljust(3, "0"))


def _calendar_date(groups: tuple[str | Any, ...]) -> tuple[int, int, int] | None:
    """``(year, month, day)`` of a real date in years 0001-9999, else None."""
    year, month, day = (int(g) for g in groups)
    try:
        date(year, month, day)
    except ValueError:
        return None
    return year, month, day


def _clock_time(groups: tuple[str | Any, ...]) -> tuple[int, int, int, int] | None:
    """``(hour, minute, second, millisecond)`` with hour ≤ 23 and second ≤ 59, else None."""
    hour, minute, second = (int(g) for g in groups[:3])
    if hour > 23 or minute > 59 or second > 59:
        return None
    return hour, minute, second, _fraction_ms(groups[3])


def _wall_ms(wall: _Wall) -> int:
    """Epoch milliseconds of the wall fields read as UTC (pure integer arithmetic)."""
    days = (date(wall.year, wall.month, wall.day) - _EPOCH_DATE).days
    seconds = (wall.hour * 60 + wall.minute) * 60 + wall.second
    return days * _DAY_MS + seconds * 1000 + wall.millisecond


def _offset_ms(text: str) -> int | None:
    """Milliseconds east of UTC for ``Z`` or ``±HH:MM``; None when out of bounds."""
    if text == "Z":
        return 0
    if text == "-00:00":
        return None
    hours, minutes = int(text[1:3]), int(text[4:6])
    if hours > 23 or minutes > 59:
        return None
    magnitude = (hours * 60 + minutes) * 60_000
    return -magnitude if text[0] == "-" else magnitude


def _resolve_string(text: str) -> int:
    match = _AT_STRING.fullmatch(text)
    if match is None:
        raise ToolError("invalid_rule", _MSG_AT_STRING)
    groups = match.groups()
    day = _calendar_date(groups[0:3])
    clock = _clock_time(groups[3:7])
    offset = _offset_ms(groups[7])
    if day is None or clock is None or offset is None:
        raise ToolError("invalid_rule", _MSG_AT_STRING)
    return _wall_ms(_Wall(*day, *clock)) - offset


def _timedelta_ms(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _local_datetime(wall: _Wall, zone: zoneinfo.ZoneInfo) -> datetime:
    return datetime(
        wall.year,
        wall.month,
        wall.day,
        wall.hour,
        wall.minute,
        wall.second,
        wall.millisecond * 1000,
        tzinfo=zone,
        fold=0,
    )


def _zone_instant(wall: _Wall, zone: zoneinfo.ZoneInfo) -> int:
    """The first instant showing ``wall`` in ``zone``; ``invalid_rule`` inside a gap.

    With ``fold=0`` an overlapped wall time takes the offset before the transition, which
    is the earlier instant; a skipped wall time does not survive the round trip back.
    An unrepresentable instant is ``time_out_of_range`` before any gap check.
    """
    offset = _local_datetime(wall, zone).utcoffset()
    if offset is None:
        # A zone that names no offset for this wall time cannot place it.
        raise ToolError("invalid_time_zone")
    instant = _wall_ms(wall) - _timedelta_ms(offset)
    if not MIN_MS <= instant <= MAX_MS:
        raise ToolError("time_out_of_range")
    try:
        back = to_datetime(instant).astimezone(zone)
    except OverflowError:
        raise ToolError("invalid_rule", _MSG_GAP) from None
    shown = _Wall(
        back.year,
        back.month,
        back.day,
        back.hour,
        back.minute,
        back.second,
        back.microsecond // 1000,
    )
    if shown != wall:
        raise ToolError("invalid_rule", _MSG_GAP)
    return instant


def _resolve_object(selector: dict[Any, Any], implicit_zone: Callable[[], str]) -> int:
    if not {"date", "time"} <= selector.keys() <= _AT_KEYS:
        raise ToolError("invalid_rule", _MSG_AT_SHAPE)
    raw_date, raw_time = selector["date"], selector["time"]
    if not isinstance(raw_date, str) or not isinstance(raw_time, str):
        raise ToolError("invalid_rule", _MSG_AT_SHAPE)
    if "time_zone" in selector and not isinstance(selector["time_zone"], str):
        raise ToolError("invalid_rule", _MSG_AT_ZONE_TYPE)
    date_match = _DATE.fullmatch(raw_date)
    if date_match is None:
        raise ToolError("invalid_rule", _MSG_AT_DATE)
    time_match = _TIME.fullmatch(raw_time)
    if time_match is None:
        raise ToolError("invalid_rule", _MSG_AT_TIME)
    day = _calendar_date(date_match.groups())
    if day is None:
        raise ToolError("invalid_rule", _MSG_AT_DATE)
    clock = _clock_time(time_match.groups())
    if clock is None:
        raise ToolError("invalid_rule", _MSG_AT_TIME)
    wall = _Wall(*day, *clock)
    zone_name = selector["time_zone"] if "time_zone" in selector else implicit_zone()
    return _zone_instant(wall, load_zone(zone_name))


def resolve_at(selector: Any, *, now_ms: int, implicit_zone: Callable[[], str]) -> int:
    """Epoch milliseconds of an ``at`` selector, strictly after ``now_ms``.

    ``implicit_zone`` is called only for a local object without ``time_zone``; it returns
    the zone name or raises ``timezone_confirmation_required``. Failures are ToolErrors:
    ``invalid_rule``, ``invalid_time_zone``, ``timezone_confirmation_required``,
    ``time_out_of_range`` and, only for a representable instant, ``not_future``.
    """
    if isinstance(selector, str):
        instant = _resolve_string(selector)
    elif isinstance(selector, dict):
        instant = _resolve_object(selector, implicit_zone)
    else:
        raise ToolError("invalid_rule", _MSG_AT_SHAPE)
    if not MIN_MS <= instant <= MAX_MS:
        raise ToolError("time_out_of_range")
    if instant <= now_ms:
        raise ToolError("not_future")
    return instant
