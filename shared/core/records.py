"""Strict version-1 ``schedule/change`` records (docs/architecture.md#schedule-records).

Decoding rejects unknown versions, operations and kinds, missing or extra keys at any
level, wrong types, non-canonical instants, untrimmed or empty prompts and out-of-range
numbers. Encoding writes keys in the documented order.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec

from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.instant import MAX_SAFE_INTEGER, is_canonical_instant

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


Schedule = AfterSchedule | AtSchedule | EverySchedule
ONE_SHOT_KINDS: Final = frozenset({"after", "at"})


class CreateChange(_Record, frozen=True, kw_only=True):
    version: Literal[1] = 1
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

_SCHEDULE_TYPES: Final[dict[str, type[AfterSchedule] | type[AtSchedule] | type[EverySchedule]]] = {
    "after": AfterSchedule,
    "at": AtSchedule,
    "every": EverySchedule,
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


def decode_change(data: Any) -> Change:
    """Decode the ``data`` of a ``schedule/change`` event; ScheduleLogError when invalid."""
    if not isinstance(data, dict):
        raise ScheduleLogError("schedule/change data is not an object")
    if data.get("version") != 1 or type(data.get("version")) is not int:
        raise ScheduleLogError("unknown schedule/change version")
    operation = data.get("operation")
    if operation == "create":
        return _decode_create(data)
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


def _decode_create(data: dict[str, Any]) -> CreateChange:
    schedule_data = data.get("schedule")
    if not isinstance(schedule_data, dict) or set(data) != _CREATE_KEYS:
        raise ScheduleLogError("malformed create record")
    kind = schedule_data.get("kind")
    schedule_type = _SCHEDULE_TYPES.get(kind) if isinstance(kind, str) else None
    if schedule_type is None:
        raise ScheduleLogError("unknown schedule kind")
    schedule: Schedule = _convert(schedule_data, schedule_type)
    _check_schedule(schedule)
    return CreateChange(schedule=schedule)


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
