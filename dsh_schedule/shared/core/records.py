"""Strict ``schedule/change`` records (docs/architecture.md#schedule-records).

Version 1 holds every operation of the ``after``, ``at`` and ``every`` kinds. Version 2
holds the create of a calendar rule (kind ``cron``), the create of a recurring record with
an end condition (``until``, ``count``) and the ``update`` record of the lifecycle
(docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders); deletes and dispatches
keep the version-1 shapes, so a log that never used them is all version 1.

A schedule as the fold holds it also carries ``paused`` and ``deliveredCount``: state
that updates and dispatches build, never written in a create.

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
from dsh_schedule.shared.core.instant import MAX_SAFE_INTEGER, is_canonical_instant, parse_instant
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
_Count = Annotated[int, msgspec.Meta(ge=1, le=MAX_SAFE_INTEGER)]
_Delivered = Annotated[int, msgspec.Meta(ge=0)]


class _Record(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class AfterSchedule(_Record, frozen=True, kw_only=True):
    id: str
    kind: Literal["after"] = "after"
    prompt: str
    afterSeconds: _Seconds
    scheduledAt: str
    paused: bool = False


class AtSchedule(_Record, frozen=True, kw_only=True):
    id: str
    kind: Literal["at"] = "at"
    prompt: str
    scheduledAt: str
    paused: bool = False


class EverySchedule(_Record, frozen=True, kw_only=True):
    id: str
    kind: Literal["every"] = "every"
    prompt: str
    everySeconds: _Every
    scheduledAt: str
    until: str | None = None
    count: _Count | None = None
    paused: bool = False
    deliveredCount: _Delivered = 0


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
    until: str | None = None
    count: _Count | None = None
    paused: bool = False
    deliveredCount: _Delivered = 0


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


ScheduleKind = Literal["after", "at", "every", "cron"]


class UpdateChange(_Record, frozen=True, kw_only=True):
    """A version-2 change of an active record: its id and only what changed. A timing
    change carries the new ``kind``, that kind's fields and the new ``scheduledAt``; a
    resume of a recurring record whose target passed carries the new ``scheduledAt``
    alone. Absent fields (None here) are never written."""

    version: Literal[2] = 2
    operation: Literal["update"] = "update"
    id: str
    prompt: str | None = None
    kind: ScheduleKind | None = None
    afterSeconds: _Seconds | None = None
    everySeconds: _Every | None = None
    cron: str | None = None
    timeZone: str | None = None
    scheduledAt: str | None = None
    paused: bool | None = None
    until: str | None = None
    count: _Count | None = None


Change = CreateChange | DeleteChange | DispatchChange | UpdateChange

# The fields of a schedule that only the fold holds, and the end conditions a create
# writes only when set.
_STATE_FIELDS: Final = ("paused", "deliveredCount")
_END_FIELDS: Final = ("until", "count")
# What each kind's timing is made of in an update, besides kind and scheduledAt.
_TIMING_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "after": ("afterSeconds",),
    "at": (),
    "every": ("everySeconds",),
    "cron": ("cron", "timeZone"),
}
_ALL_TIMING_FIELDS: Final = ("afterSeconds", "everySeconds", "cron", "timeZone")


def has_end(schedule: Schedule) -> bool:
    """Whether ``schedule`` is recurring with an end condition (``until`` or ``count``)."""
    return isinstance(schedule, RECURRING_TYPES) and (
        schedule.until is not None or schedule.count is not None
    )


def create_change(schedule: Schedule) -> CreateChange:
    """The create record of ``schedule``: version 2 for a calendar rule or a record with
    an end condition, else version 1."""
    if isinstance(schedule, CronSchedule) or has_end(schedule):
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
    2: {"cron": CronSchedule, "every": EverySchedule},
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
    if isinstance(schedule, RECURRING_TYPES) and schedule.until is not None:
        check_until(schedule.until, schedule.scheduledAt)


def check_until(until: str, scheduled_at: str) -> None:
    """``until`` must be a canonical instant not before the record's target."""
    if not is_canonical_instant(until):
        raise ScheduleLogError("until is not a canonical UTC instant")
    if parse_instant(until) < parse_instant(scheduled_at):
        raise ScheduleLogError("until is before the record's target")


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
    if operation == "update" and version == 2:
        return _decode_update(data)
    if version != 1:
        raise ScheduleLogError(f"version {version} holds only creates and updates")
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
    for key in _STATE_FIELDS:
        if key in schedule_data:
            raise ScheduleLogError(f"a create carries {key!r}")
    ends = [key for key in _END_FIELDS if key in schedule_data]
    if version == 1 and ends:
        raise ScheduleLogError(f"a version-1 create carries {ends[0]!r}")
    if version == 2 and kind == "every" and not ends:
        raise ScheduleLogError("a version-2 every create carries no end condition")
    if any(schedule_data[key] is None for key in ends):
        raise ScheduleLogError("an end condition is null")
    schedule: Schedule = _convert(schedule_data, schedule_type)
    _check_schedule(schedule)
    return create_change(schedule)


def _decode_update(data: dict[str, Any]) -> UpdateChange:
    """The shape of an update; whether it applies to the record it names is replay's."""
    if any(value is None for value in data.values()):
        raise ScheduleLogError("an update field is null")
    change = _convert(data, UpdateChange)
    if not _valid_id(change.id):
        raise ScheduleLogError("schedule id is empty, padded or not valid UTF-8")
    if change.prompt is not None and (
        change.prompt == "" or js_trim(change.prompt) != change.prompt
        or not is_utf8_safe(change.prompt)
    ):
        raise ScheduleLogError("update prompt is empty, untrimmed or not valid UTF-8")
    wanted = _TIMING_FIELDS[change.kind] if change.kind is not None else ()
    for key in _ALL_TIMING_FIELDS:
        if (key in data) != (key in wanted):
            raise ScheduleLogError(f"update timing of kind {change.kind} carries or lacks {key!r}")
    if change.kind is not None and change.scheduledAt is None:
        raise ScheduleLogError("update timing lacks scheduledAt")
    if change.kind is None and change.scheduledAt is not None and change.paused is not False:
        raise ScheduleLogError("update moves scheduledAt without a timing or a resume")
    if change.scheduledAt is not None and not is_canonical_instant(change.scheduledAt):
        raise ScheduleLogError("scheduledAt is not a canonical UTC instant")
    if change.until is not None and not is_canonical_instant(change.until):
        raise ScheduleLogError("until is not a canonical UTC instant")
    if change.cron is not None and change.timeZone is not None:
        fault = _cron_fault(change.cron, change.timeZone)
        if fault is not None:
            raise ScheduleLogError(fault)
    if len(data) == 3:
        raise ScheduleLogError("update carries no change")
    return change


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
    if cls is UpdateChange:
        return ("version", "operation", "id")
    return tuple(f for f in cls.__struct_fields__ if f not in _OPTIONAL_FIELDS)


_OPTIONAL_FIELDS: Final = frozenset({"acceptedAt", *_STATE_FIELDS, *_END_FIELDS})


def encode_change(change: Change) -> dict[str, Any]:
    """The event ``data`` for a change, keys in the documented order; absent fields and
    the fold's own state are left out."""
    result: dict[str, Any] = msgspec.to_builtins(change)
    if isinstance(change, DispatchChange) and change.acceptedAt is None:
        del result["acceptedAt"]
    elif isinstance(change, UpdateChange):
        result = {key: value for key, value in result.items() if value is not None}
    elif isinstance(change, CreateChange):
        schedule = result["schedule"]
        for key in _STATE_FIELDS:
            schedule.pop(key, None)
        for key in _END_FIELDS:
            if schedule.get(key, 0) is None:
                del schedule[key]
    return result
