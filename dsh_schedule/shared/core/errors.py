"""The closed v1 domain error codes and the exceptions that carry them.

Every public failure of a Schedule tool is one of the eleven closed codes, or, with the
lifecycle on (docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders), the
twelfth, ``limit_exceeded``. Messages
are stable, written for a model to act on, and never contain exception text or paths.
"""

from __future__ import annotations

import errno
from typing import Any, Final, Literal, get_args

ErrorCode = Literal[
    "invalid_prompt",
    "invalid_selector",
    "invalid_rule",
    "invalid_time_zone",
    "timezone_confirmation_required",
    "not_future",
    "time_out_of_range",
    "frequency_too_high",
    "corrupt_schedule_log",
    "persistence_uncertain",
    "internal_error",
    "limit_exceeded",
]

ERROR_CODES: Final[tuple[str, ...]] = get_args(ErrorCode)
# The codes a tool without the lifecycle can answer: the eleven version-1 codes.
V1_ERROR_CODES: Final[tuple[str, ...]] = tuple(c for c in ERROR_CODES if c != "limit_exceeded")

DEFAULT_MESSAGES: Final[dict[str, str]] = {
    "invalid_prompt": "prompt must be a non-empty string after trimming whitespace.",
    "invalid_selector": (
        "Provide exactly one of after_seconds, at, or every_seconds, and no other keys."
    ),
    "invalid_rule": "The time rule is not valid.",
    "invalid_time_zone": (
        "time_zone must be \"UTC\" or an IANA Area/Location name such as \"Europe/Berlin\"."
    ),
    "timezone_confirmation_required": (
        "The time zone for this local time is not confirmed; ask the user and pass time_zone "
        "explicitly."
    ),
    "not_future": "The reminder time must be strictly in the future.",
    "time_out_of_range": "The reminder time is outside the supported range (years 0001-9999).",
    "frequency_too_high": "every_seconds must be at least 300.",
    "corrupt_schedule_log": (
        "The session's schedule history is invalid; no schedule operation can be performed."
    ),
    "persistence_uncertain": (
        "The session could not be confirmed durable; the outcome is unknown. Retry later or "
        "list schedules to see what was kept."
    ),
    "internal_error": "The schedule service failed unexpectedly; nothing was changed.",
    "limit_exceeded": "This session holds the most active reminders it may; nothing was created.",
}


class ScheduleError(Exception):
    """Root of every Schedule failure."""


class ToolError(ScheduleError):
    """A domain failure answered to the model as ``{"code", "message", ...extra}``."""

    def __init__(self, code: ErrorCode, message: str | None = None, **extra: Any) -> None:
        self.code: ErrorCode = code
        self.message: str = message if message is not None else DEFAULT_MESSAGES[code]
        self.extra: dict[str, Any] = extra
        super().__init__(f"{code}: {self.message}")

    def value(self) -> dict[str, Any]:
        """The canonical error value, keys in order: code, message, then the extras."""
        return {"code": self.code, "message": self.message, **self.extra}


class ScheduleLogError(ScheduleError, ValueError):
    """A session log whose Schedule records break the version-1 replay rules."""

    def __init__(self, reason: str, seq: int | None = None) -> None:
        self.reason = reason
        self.seq = seq
        where = f"event {seq}: " if seq is not None else ""
        super().__init__(f"{where}{reason}")


class EventOutOfBounds(ScheduleError, ValueError):
    """An event a session log cannot hold: its line would nest deeper, or be longer, than
    every line of a session log may (docs/architecture.md#session-logs). The append that
    carried it wrote nothing."""

    def __init__(self, event_type: str, reason: str) -> None:
        self.event_type = event_type
        self.reason = reason
        super().__init__(
            f"an event of type {event_type!r} cannot be stored in a session log: its line "
            f"{reason} (docs/architecture.md#session-logs)"
        )


class PersistenceError(ScheduleError, OSError):
    """The session store could not read, write or confirm durability. ``outage_said``:
    the failure belongs to an outage of the store that the store itself has said (one line
    when it started, one when it ends), so a caller need not say it again."""

    outage_said: bool = False

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def outage_said(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``PersistenceError`` of an outage the store has already said."""
    return isinstance(exc, PersistenceError) and exc.outage_said


# What a disk that cannot take writes now says: full, over quota, read-only, failing.
DISK_OUTAGE_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def disk_outage_errno(exc: BaseException) -> int | None:
    """The errno, when ``exc`` (a ``PersistenceError`` or what caused it) says the disk
    under the session store cannot take writes now rather than that one session file is
    wrong; else None (docs/architecture.md#outages)."""
    seen: set[int] = set()
    found: BaseException | None = exc
    while found is not None and id(found) not in seen:
        seen.add(id(found))
        if isinstance(found, OSError) and found.errno in DISK_OUTAGE_ERRNOS:
            return found.errno
        found = found.__cause__ or found.__context__
    return None


class FenceConflict(ScheduleError):
    """An append found the log at another length than the caller expected."""

    def __init__(self, expected: int, actual: int) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(f"expected log length {expected}, found {actual}")
