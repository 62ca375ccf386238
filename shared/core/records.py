"""Strict ``schedule/change`` records (docs/architecture.md#schedule-records).

Version 1 holds every operation of the ``after``, ``at`` and ``every`` kinds. Version 2
is only the create of a calendar rule (kind ``cron``); its delete and dispatch keep the
version-1 shapes, so a log that never used calendar rules is all version 1.

Decoding rejects unknown versions, operations and kinds (a version-2 record of any other
kind, a version-1 create of a ``cron`` record), missing or extra keys at any level, wrong
types, non-canonical instants, untrimmed or empty prompts, out-of-range numbers, a rule
that is not in its stored form or not valid, and a zone that is not ``UTC`` or a known
Area/Location name. Encoding writes keys in the documented order.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec

from dsh_schedule.shared.core.cron import normalise_expression, parse_rule
from dsh_schedule.shared.core.errors import ScheduleLogError, ToolError
from dsh_schedule.shared.core.instant import MAX_SAFE_INTEGER, is_canonical_instant
from dsh_schedule.shared.core.timesel import load_zone

MIN_EVERY_SECONDS: Final[int] = 300
# everySeconds * 1000 must stay a safe integer.
MAX_EVERY_SECONDS: Final[int] = MAX_SAFE_INTEGER // 1000

# Exactly the JavaScript String.prototype.trim whitespace set (WhiteSpace + LineTerminator).
JS_WHITESPACE: Final[str] = (
    "\u0009\u000a\u000b\u000c\u000d\u0020\u00a0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def js_trim(text: str) -> str:
    """``String.prototype.trim``: strips exactly the JavaScript whitespace set."""
    return text.strip(JS_WHITESPACE)


def is_utf8_safe(text: str) -> bool:
    """False when the text holds a lone surrogate that UTF-8 cannot store."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_Seconds = Annotated[int, msgspec.Meta(ge=1, le=MAX_SAFE_INTEGER)]
_Every = Annotated[int, msgspec.Meta(ge=MIN_EVERY_SECONDS, le=MAX_EVERY_SECONDS)]


class _Record(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class AfterSchedule(_Record, frozen=True, kw_only=True):
    id: str
    kind: Literal["after"] = "after"
    prompt: str
    afterSeconds: _Seconds
    scheduledAt: str


class AtSchedule(_Record, frozen=True, kw_only=True):
    id: str
    kind: Literal["at"] = "at"
    prompt: str
    scheduledAt: str


class EverySchedule(_Record, frozen=True, kw_only=True):
    id: str
    kind: Literal["every"] = "every"
    prompt: str
    everySeconds: _Every
    scheduledAt: str


class CronSchedule(_Record, frozen=True, kw_only=True):
    """A calendar rule (docs/decisions.md#calendar-rules): ``cron`` is the expression in
    its stored form, ``timeZone`` the zone it is evaluated in, ``scheduledAt`` its next
    occurrence."""

    id: str
    kind: Literal["cron"] = "cron"
    prompt: str
    cron: str
    timeZone: str
    scheduledAt: str


Schedule = AfterSchedule | AtSchedule | EverySchedule | CronSchedule
RecurringSchedule = EverySchedule | CronSchedule
RECURRING_TYPES: Final = (EverySchedule, CronSchedule)
ONE_SHOT_KINDS: Final = frozenset({"after", "at"})


class CreateChange(_Record, frozen=True, kw_only=True):
    """Build it with ``create_change``, which picks the version the kind needs."""

    version: Literal[1, 2] = 1
    operation: Literal["create"] = "create"
    schedule: Schedule


class DeleteChange(_Record, frozen=True, kw_only=True):
    version: Literal[1] = 1
    operation: Literal["delete"] = "delete"
    id: str


class DispatchChange(_Record, frozen=True, kw_only=True):
    """One-shot dispatches carry only the id; ``every`` dispatches add ``acceptedAt``."""

    version: Literal[1] = 1
    operation: Literal["dispatch"] = "dispatch"
    id: str
    acceptedAt: str | None = None


Change = CreateChange | DeleteChange | DispatchChange


def create_change(schedule: Schedule) -> CreateChange:
    """The create record of ``schedule``: version 2 for a calendar rule, else version 1."""
    if isinstance(schedule, CronSchedule):
        return CreateChange(version=2, schedule=schedule)
    return CreateChange(version=1, schedule=schedule)


_ScheduleType = type[AfterSchedule] | type[AtSchedule] | type[EverySchedule] | type[CronSchedule]
_SCHEDULE_TYPES: Final[dict[str, _ScheduleType]] = {
    "after": AfterSchedule,
    "at": AtSchedule,
    "every": EverySchedule,
}
_CREATE_TYPES: Final[dict[int, dict[str, _ScheduleType]]] = {
    1: _SCHEDULE_TYPES,
    2: {"cron": CronSchedule},
}
_CREATE_KEYS: Final = frozenset({"version", "operation", "schedule"})

_R = TypeVar("_R", bound=_Record)


def _valid_id(value: str) -> bool:
    return value != "" and js_trim(value) == value and is_utf8_safe(value)


def _check_schedule(schedule: Schedule) -> None:
    if not _valid_id(schedule.id):
        raise ScheduleLogError("schedule id is empty, padded or not valid UTF-8")
    if schedule.prompt == "" or js_trim(schedule.prompt) != schedule.prompt:
        raise ScheduleLogError("prompt is empty or untrimmed")
    if not is_utf8_safe(schedule.prompt):
        raise ScheduleLogError("prompt holds a lone surrogate")
    if not is_canonical_instant(schedule.scheduledAt):
        raise ScheduleLogError("scheduledAt is not a canonical UTC instant")
    if isinstance(schedule, CronSchedule):
        _check_cron(schedule)


def _check_cron(schedule: CronSchedule) -> None:
    """The rule must be valid and in its stored form, the zone one the pinned zone data
    names. Nothing is checked against the zone's offsets: a log stays readable whatever
    the zone data says later (docs/decisions.md#calendar-rules)."""
    fault = _cron_fault(schedule.cron, schedule.timeZone)
    if fault is not None:
        raise ScheduleLogError(fault)


@functools.lru_cache(maxsize=1024)
def _cron_fault(cron: str, zone: str) -> str | None:
    """What is wrong with a stored rule and zone, or None (a record is decoded several
    times on its way into a log, and a session's rules repeat)."""
    if normalise_expression(cron) != cron:
        return "cron is not in its stored form"
    try:
        rule = parse_rule(cron)
        load_zone(zone)
    except ToolError as exc:
        return f"cron record is not valid: {exc.code}"
    if not rule.possible:
        return "cron rule matches no date"
    return None


def decode_change(data: Any) -> Change:
    """Decode the ``data`` of a ``schedule/change`` event; ScheduleLogError when invalid."""
    if not isinstance(data, dict):
        raise ScheduleLogError("schedule/change data is not an object")
    version = data.get("version")
    if type(version) is not int or version not in _CREATE_TYPES:
        raise ScheduleLogError("unknown schedule/change version")
    operation = data.get("operation")
    if operation == "create":
        return _decode_create(data, version)
    if version != 1:
        raise ScheduleLogError(f"version {version} holds only creates")
    change: DeleteChange | DispatchChange
    if operation == "delete":
        change = _convert(data, DeleteChange)
    elif operation == "dispatch":
        if data.get("acceptedAt", "") is None:
            raise ScheduleLogError("acceptedAt is null")
        change = _convert(data, DispatchChange)
    else:
        raise ScheduleLogError("unknown schedule/change operation")
    if not _valid_id(change.id):
        raise ScheduleLogError("schedule id is empty, padded or not valid UTF-8")
    if isinstance(change, DispatchChange) and change.acceptedAt is not None:
        if not is_canonical_instant(change.acceptedAt):
            raise ScheduleLogError("acceptedAt is not a canonical UTC instant")
    return change


def _decode_create(data: dict[str, Any], version: int) -> CreateChange:
    schedule_data = data.get("schedule")
    if not isinstance(schedule_data, dict) or set(data) != _CREATE_KEYS:
        raise ScheduleLogError("malformed create record")
    kind = schedule_data.get("kind")
    schedule_type = _CREATE_TYPES[version].get(kind) if isinstance(kind, str) else None
    if schedule_type is None:
        raise ScheduleLogError(f"unknown schedule kind for version {version}")
    schedule: Schedule = _convert(schedule_data, schedule_type)
    _check_schedule(schedule)
    return create_change(schedule)


def _convert(data: dict[str, Any], cls: type[_R]) -> _R:
    for key in _required_keys(cls):
        if key not in data:
            raise ScheduleLogError(f"missing key {key!r}")
    try:
        return msgspec.convert(data, type=cls, strict=True)
    except msgspec.ValidationError as exc:
        raise ScheduleLogError(f"malformed record: {exc}") from None


def _required_keys(cls: type[_Record]) -> tuple[str, ...]:
    # Fields with defaults (kind, version, operation) must still be present in a log.
    return tuple(f for f in cls.__struct_fields__ if f != "acceptedAt")


def encode_change(change: Change) -> dict[str, Any]:
    """The event ``data`` for a change, keys in the documented order."""
    result: dict[str, Any] = msgspec.to_builtins(change)
    if isinstance(change, DispatchChange) and change.acceptedAt is None:
        del result["acceptedAt"]
    return result
